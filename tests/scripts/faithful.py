"""A script of the kinds a new user brings (tests/test_faithful.py): a tiny language model
whose output layer is tied to its token embedding, with BatchNorm between, SGD with Nesterov
momentum under OneCycleLR (which cycles the momentum too), or AdamW over two param groups
under a ReduceLROnPlateau stepped on each worker's own figure (`--plateau own`) or on the
workers' mean (`--plateau mean`). It evaluates the final model itself (job.finish(evaluate=)),
saves it with job.save, and writes what each worker holds: its own buffers before finish
(`--dump DIR`: own-W.pt) and its model and rates after (final-W.pt, lr-W.pt). `--fault`
forgets a call."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import polyrhythm as pr

VOCAB, CONTEXT, WIDTH, EXAMPLES, BATCH = 16, 4, 8, 96, 12  # 2 workers: 4 steps an epoch


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.BatchNorm1d(WIDTH)
        self.mix = nn.Linear(CONTEXT * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's output layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x).reshape(-1, WIDTH)).reshape(len(x), -1)
        return self.head(torch.tanh(self.mix(h)))


def data(seed: int = 1) -> torch.utils.data.TensorDataset:
    x = torch.randint(0, VOCAB, (EXAMPLES, CONTEXT), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(x, x.sum(1) % VOCAB)


def evaluate(model: nn.Module) -> dict:
    """The figures of a model on the validation set (its own BatchNorm statistics)."""
    x, y = data(seed=2).tensors
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x)
    model.train(was)
    return {"val_loss": F.cross_entropy(logits, y).item(),
            "val_accuracy": (logits.argmax(1) == y).double().mean().item()}


def build(optimizer: str, epochs: int, steps: int):
    torch.manual_seed(0)
    model = TiedLM()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        return model, opt, torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=0.3, total_steps=epochs * steps)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=0.05)
    # After epoch 2 worker 0's own loss fell 23 %, worker 1's 30 %, their mean 27 %: on its
    # own figure worker 0 alone halves its rate; on the mean, both do after epoch 3 (17 %).
    return model, opt, torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=0.5, patience=0, threshold=0.25)


def main(args) -> None:
    job = None if args.fault == "no-init" else pr.init()
    train = data()
    steps = EXAMPLES // 2 // BATCH
    model, opt, sched = build(args.optimizer, args.epochs, steps)
    if job is None:  # a plain loop that never joined its job: every rank would train it all
        opt.zero_grad()
        F.cross_entropy(model(train.tensors[0]), train.tensors[1]).backward()
        opt.step()
        return
    model, opt = job.wrap(model, opt)
    for _ in job.epochs(args.epochs):
        own = 0.0
        for x, y in job.loader(train, batch_size=BATCH):
            loss = F.cross_entropy(model(x), y)
            job.backward(loss, exchange=not args.clip)
            if args.clip:
                job.clip_grad_norm_(args.clip)
            opt.step()
            opt.zero_grad()
            own += loss.item()
            if args.optimizer == "sgd":
                sched.step()
        if args.plateau:  # each worker's own training loss, or the workers' mean of it
            sched.step(job.mean(own) if args.plateau == "mean" else own)
        job.log(**evaluate(model))  # this worker's model now: an epoch's figure
    if args.dump:
        torch.save({k: v for k, v in model.state_dict().items() if "norm" in k},
                   f"{args.dump}/own-{job.worker}.pt")
    if args.fault == "forget-finish":
        return
    job.finish(evaluate=evaluate)
    if args.save:
        job.save(args.save)
    if args.dump:
        torch.save(model.state_dict(), f"{args.dump}/final-{job.worker}.pt")
        torch.save([group["lr"] for group in opt.param_groups], f"{args.dump}/lr-{job.worker}.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--plateau", choices=["own", "mean"])
    parser.add_argument("--clip", type=float)
    parser.add_argument("--save")
    parser.add_argument("--dump")
    parser.add_argument("--fault", choices=["forget-finish", "no-init"])
    main(parser.parse_args())
