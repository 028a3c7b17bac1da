"""A user's training script, as tests run it (tests/test_script.py): a small regression
with AdamW over two param groups (weight decay on weights only, the biases at half the
rate) and a cosine schedule, or SGD with momentum; `--ddp` trains the same under torch's
DistributedDataParallel instead (torchrun), `--fault` breaks it one way. The final
parameters are saved by worker 0 to --save. `--keep FILE` keeps the schedule and a tally of
the steps in the checkpoints (job.keep) and writes the tally there at the end;
`--fail-once MARKER` fails worker 1 after its first step of epoch 3 unless MARKER exists,
which it then makes, so the run resumed goes on (tests/test_script_resume.py).
Each step's loss goes to `job.backward(loss)`, or with `--plain-backward` to `loss.backward()`;
`--deep` trains a model of three layers, and `--probe FILE` has worker 0 write, for each
step, how many messages it had sent when its first layer's gradient was computed (the last
of the step's backward)."""

import argparse
import os
import signal
import sys

import torch
import torch.nn.functional as F

import polyrhythm as pr

parser = argparse.ArgumentParser()
parser.add_argument("--optimizer", default="adamw",
                    choices=["adamw", "sgd", "sgd-groups", "adafactor"])
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--save")
parser.add_argument("--ddp", action="store_true")
parser.add_argument("--plain-epochs", action="store_true",
                    help="range(epochs), not job.epochs: each pass of the loader is an epoch")
parser.add_argument("--fault", choices=["wrap-twice", "unwrapped", "seed", "raise", "exit",
                                        "no-val-loss", "uneven-val-loss", "counted-output",
                                        "log-of-output", "killed-after-finish", "given-stepped",
                                        "clip-after-send", "backward-twice"])
parser.add_argument("--plain-backward", action="store_true")
parser.add_argument("--deep", action="store_true")
parser.add_argument("--probe", metavar="FILE")
parser.add_argument("--keep", metavar="FILE")
parser.add_argument("--fail-once", metavar="MARKER")
parser.add_argument("--kill", nargs=2, type=int, metavar=("WORKER", "STEP"),
                    help="worker WORKER kills itself (SIGKILL) once it has taken STEP steps (0: "
                    "once it has joined the job)")
EXAMPLES, BATCH = 160, 16  # 2 workers: 5 steps an epoch


class Tally:
    """The steps this worker took, kept in the checkpoints: a resumed run counts on."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def build(optimizer: str, seed: int = 0, deep: bool = False):
    """The model, its optimizer and its schedule."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if deep:
        model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 1))
    opt = make_optimizer(model, optimizer)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=16)


class Counted(torch.nn.Module):
    """A model whose output also says how many examples it saw, as a plain int."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> dict:
        return {"prediction": self.model(x), "examples": len(x)}


def make_optimizer(model, optimizer: str):
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if optimizer == "sgd-groups":  # plain SGD, the biases at a fifth of the weights' rate
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        return torch.optim.SGD([{"params": decay}, {"params": rest, "lr": 0.01}], lr=0.05)
    if optimizer == "adafactor":
        return torch.optim.Adafactor(model.parameters(), lr=0.01)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0, "lr": 0.01}], lr=0.02)


def data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(EXAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x.sum(1, keepdim=True) * 0.5).sin())


def ddp(args) -> None:
    import torch.distributed as dist

    from polyrhythm.runtime.worker.script_data import ShardSampler

    dist.init_process_group("gloo")
    model, opt, sched = build(args.optimizer)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    # The shards polyrhythm's loader gives (seed 0), so both see the same batches.
    sampler = ShardSampler(EXAMPLES, dist.get_rank(), dist.get_world_size(), seed=0)
    for _ in range(args.epochs):
        for x, y in torch.utils.data.DataLoader(data(), batch_size=BATCH, sampler=sampler):
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), args.save)
    dist.barrier()
    # Out without tearing DDP down: its teardown at exit sometimes aborts (SIGABRT,
    # "terminate called without an active exception"; 1 run in 12 here), which would fail
    # the comparison by luck. Every rank's work is saved and flushed by now.
    sys.stdout.flush()
    os._exit(0)


def die_at(args, job, taken: int) -> None:
    """--kill: this worker ends itself (SIGKILL) once it has taken as many steps."""
    if args.kill == [job.worker, taken]:
        os.kill(os.getpid(), signal.SIGKILL)


def main(args) -> None:
    job = pr.init()
    die_at(args, job, 0)
    model, opt, sched = build(args.optimizer, seed=job.worker if args.fault == "seed" else 0,
                              deep=args.deep)
    if args.fault == "counted-output":
        model = Counted(model)
    given = opt
    model, opt = job.wrap(model, opt)
    if args.fault == "given-stepped":
        opt = given
    probe = Probe(job, model, args.probe)
    if args.fault == "wrap-twice":
        job.wrap(model, opt)
    tally = Tally()
    if args.keep:
        job.keep("schedule", sched)
        job.keep("tally", tally)
    for epoch in range(args.epochs) if args.plain_epochs else job.epochs(args.epochs):
        for step, (x, y) in enumerate(job.loader(data(), batch_size=BATCH)):
            die_at(args, job, tally.steps)  # before its backward, which may push already
            probe.begin()
            output = model(x)
            loss = F.mse_loss(output["prediction"] if isinstance(output, dict) else output, y)
            if args.fault == "log-of-output":  # finite on a real output, infinite on zeros
                loss = loss - output.abs().log().mean()
            if args.plain_backward:
                loss.backward()
            else:
                job.backward(loss)
            if args.fault == "clip-after-send":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if args.fault == "backward-twice":
                job.backward(F.mse_loss(model(x), y))
            if args.fault == "raise" and job.worker == 1 and epoch == 1:
                raise ValueError("the user's own bug")
            if args.fault == "unwrapped":
                torch.optim.SGD(model.parameters(), lr=0.1).step()
            opt.step()
            opt.zero_grad()
            sched.step()
            tally.steps += 1
            if args.fail_once and (job.worker, epoch, step) == (1, 2, 0):
                fail_once(args.fail_once)
        with torch.no_grad():
            x, y = data().tensors
            if args.fault == "uneven-val-loss" and job.worker > 0:
                job.log(val_loss=1.0)  # a figure of its own, unlike worker 0's
            elif args.fault != "no-val-loss":
                job.log(val_loss=F.mse_loss(model(x), y))
        print(f"worker {job.worker}: epoch {epoch + 1} done")  # a launcher shows worker 0's
    if args.save and job.worker == 0:
        torch.save(model.state_dict(), args.save)
    if args.keep and job.worker == 0:
        with open(args.keep, "w") as file:
            file.write(str(tally.steps))
    probe.write()
    job.finish()
    if args.fault == "killed-after-finish" and job.worker == 1:  # the run is recorded by now
        os.kill(os.getpid(), signal.SIGKILL)


class Probe:
    """--probe: on worker 0, the messages it sent in each step from its forward until
    the gradient of the model's first layer was computed (a tensor hook runs then), written
    to `path` one step a line."""

    def __init__(self, job, model: torch.nn.Module, path: str | None) -> None:
        self.path, self.seen = path if job.worker == 0 else None, []
        if self.path is not None:
            self.counters = job.ctx.transport.counters
            model[0].weight.register_hook(self.computed)

    def begin(self) -> None:
        if self.path is not None:
            self.sent = self.counters.messages_sent

    def computed(self, grad: torch.Tensor) -> None:
        self.seen.append(self.counters.messages_sent - self.sent)

    def write(self) -> None:
        if self.path is not None:
            with open(self.path, "w") as file:
                file.write("\n".join(map(str, self.seen)))


def fail_once(marker: str) -> None:
    """Fail unless `marker` exists, making it: the run fails, its resume goes on. After a
    step of the epoch, which every worker takes only once every rank's files of the
    checkpoint before it are written, so that checkpoint is always the newest."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("failing once, as asked")


if __name__ == "__main__":
    arguments = parser.parse_args()
    try:
        ddp(arguments) if arguments.ddp else main(arguments)
    except pr.ConfigError as error:
        if arguments.fault != "exit":
            raise
        # A script that says a job's error its own way and ends itself, as argparse does.
        print(f"user_loop: error: {error}", file=sys.stderr)
        sys.exit(3)
