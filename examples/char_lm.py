"""A character-level causal transformer language model, trained as a polyrhythm job.

It shows an ordinary PyTorch training loop (AdamW with two param groups, a warm-up then
cosine schedule, gradient clipping, a held-out validation loss and next-character accuracy)
made distributed by six polyrhythm lines: `pr.init()`, `job.wrap(model, opt)`, `job.epochs`,
`job.loader`, `job.backward(loss)` and `job.finish()`. The text ships with Python: the help texts of
`pydoc_data.topics` (what `help("topics")` shows), about 460 KB, so nothing is downloaded.

    python examples/char_lm.py --steps 100                  # alone, as a plain script
    polyrhythm run --strategy allreduce --workers 2 examples/char_lm.py -- --steps 100
    polyrhythm run --strategy ssp --workers 2 examples/char_lm.py -- --steps 40
    polyrhythm run --strategy bsp --servers 2 --workers 2 examples/char_lm.py -- --steps 40
    torchrun --standalone --nproc-per-node 2 examples/char_lm.py --ddp --steps 100
    torchrun --standalone --nproc-per-node 2 examples/char_lm.py --ddp --powersgd 4

`--ddp` trains the same model under torch's own DistributedDataParallel (started by torchrun),
on the very batches polyrhythm's all-reduce takes, to compare the two: both end with the same
parameters, clipped or not. Under polyrhythm the clip is `job.clip_grad_norm_`, which clips
what the step applies (under all-reduce the workers' mean gradient, as DDP's clip after its
backward does); `torch.nn.utils.clip_grad_norm_` would clip each worker's own before the
exchange. A clipped step's loss goes to `job.backward(loss, exchange=False)`: the gradients
leave at the step, once clipped; unclipped, they leave as backward makes them.

`--ddp --powersgd R` registers PyTorch's own PowerSGD communication hook (rank R, error
feedback and warm start, matrices compressed where the factors take under half of them) to
compare with polyrhythm's `--compress powersgd --rank R`. The hook sends the first 2 steps
uncompressed: with error feedback or warm start, 2 is the least `start_powerSGD_iter` it
allows (DDP rebuilds its buckets after its first step). Under polyrhythm the compression is the
launcher's: `polyrhythm run --compress powersgd --rank R ...`, not an argument of the script.

`--steps` counts each worker's optimizer steps (the loop stops there); an epoch is one pass
over this worker's share of the training windows, and the validation loss and accuracy (the
share of the validation text's characters whose most likely prediction is the character that
follows) are logged after each (and after the last, partial one): `job.log` under polyrhythm,
and worker 0 prints `val_loss 1.2345 val_accuracy 0.6543` in every mode. `--seed` seeds the
model's initialisation; which windows each worker reads, and in which order, is the job's
(`polyrhythm run --seed`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pydoc_data.topics import topics

import torch
import torch.nn.functional as F
from torch import nn

import polyrhythm as pr
from polyrhythm.errors import ConfigError, PolyrhythmError

VALIDATION_FRACTION = 0.1  # the tail of the text, never trained on
ONE_BUCKET_MB = 1024  # --ddp --powersgd: every gradient in one DDP bucket


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per worker")
    parser.add_argument("--batch", type=int, default=16, help="windows per worker and step")
    parser.add_argument("--context", type=int, default=64, help="characters per window")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--clip", type=float, default=1.0,
                        help="clip each step's gradient to this norm (0: no clipping)")
    parser.add_argument("--chars", type=int, default=None,
                        help="use only the first CHARS characters of the text (quick tries)")
    parser.add_argument("--save", help="the run's final model's state_dict goes here")
    parser.add_argument("--ddp", action="store_true",
                        help="train under torch's DistributedDataParallel (torchrun) instead")
    parser.add_argument("--powersgd", type=int, metavar="R",
                        help="with --ddp: DDP's PowerSGD hook at rank R (error feedback, warm "
                             "start, from step 3; under polyrhythm: polyrhythm run --compress "
                             "powersgd --rank R)")
    parser.add_argument("--log-every", type=int, default=20,
                        help="print the step and its loss every K steps (worker 0; 0: never)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model's initialisation")
    parser.add_argument("--measure-after", type=int, metavar="K",
                        help="worker 0 prints the job's samples/s over the steps after the "
                             "first K (benchmarks/script.py compares runs by it)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "context", "width", "layers", "heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.width % args.heads:
        parser.error(f"--width {args.width} must be a multiple of --heads {args.heads}")
    if args.lr <= 0:
        parser.error(f"--lr must be positive, not {args.lr}")
    if args.powersgd is not None and not args.ddp:
        parser.exit(2, f"{parser.prog}: error: --powersgd R is DDP's PowerSGD hook, for --ddp; "
                       "under polyrhythm give polyrhythm run --compress powersgd --rank R\n")
    if args.powersgd is not None and args.powersgd < 1:
        parser.error(f"--powersgd must be at least 1, not {args.powersgd}")
    if args.measure_after is not None and not 0 <= args.measure_after < args.steps:
        parser.error(f"--measure-after must be from 0 to --steps - 1 ({args.steps - 1}), "
                     f"not {args.measure_after}")
    return args


# -- the data ----------------------------------------------------------------------------

def corpus(chars: int | None) -> str:
    """Python's help texts, in the order of their topic names (the same text everywhere)."""
    return "\n".join(topics[name] for name in sorted(topics))[:chars]


class CharWindows(torch.utils.data.Dataset):
    """Non-overlapping windows of `context` characters, each with the characters that follow
    every one of its positions (the inputs shifted by one)."""

    def __init__(self, codes: torch.Tensor, context: int) -> None:
        self.codes, self.context = codes, context

    def __len__(self) -> int:
        return (len(self.codes) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        window = self.codes[start:start + self.context + 1]
        return window[:-1], window[1:]


def datasets(text: str, context: int) -> tuple[CharWindows, CharWindows, int]:
    """Training windows, validation windows (the text's tail) and the vocabulary's size."""
    vocabulary = sorted(set(text))
    lookup = {char: code for code, char in enumerate(vocabulary)}
    encoded = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    split = int(len(encoded) * (1 - VALIDATION_FRACTION))
    train, validation = CharWindows(encoded[:split], context), CharWindows(encoded[split:],
                                                                            context)
    if len(validation) < 1:
        raise ConfigError(f"--context {context} is longer than the validation text "
                          f"({len(encoded) - split} characters): use more --chars")
    return train, validation, len(vocabulary)


# -- the model ---------------------------------------------------------------------------

class CharTransformer(nn.Module):
    """Token and position embeddings, pre-norm transformer blocks under a causal mask (each
    position attends to itself and the positions before it), a final norm and an untied
    linear head over the vocabulary."""

    def __init__(self, vocabulary: int, context: int, width: int, layers: int,
                 heads: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocabulary, width)
        self.position = nn.Embedding(context, width)
        # No dropout: a small model trained for a few hundred steps does not overfit, and
        # without it a run is a function of its seed alone (DDP and polyrhythm compare).
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        length = codes.shape[1]
        positions = torch.arange(length, device=codes.device)
        hidden = self.token(codes) + self.position(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=codes.device)
        for block in self.blocks:
            hidden = block(hidden, src_mask=mask, is_causal=True)
        return self.head(self.norm(hidden))


def build(args: argparse.Namespace, vocabulary: int):
    """The model (the same on every worker: seeded), AdamW and its schedule."""
    torch.manual_seed(args.seed)
    model = CharTransformer(vocabulary, args.context, args.width, args.layers, args.heads)
    # Weight decay shrinks the linear layers' weight matrices (attention's projections, the
    # feed-forward layers, the head); biases, the norms' gains and shifts and the two
    # embeddings are left alone: decaying them only pulls them toward zero for no gain.
    embeddings = {id(model.token.weight), id(model.position.weight)}
    decayed = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    kept = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                             {"params": kept, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_cosine(args.steps))
    return model, opt, schedule


def warmup_then_cosine(steps: int):
    """The rate's factor at each step: a linear rise over the first tenth of the steps,
    then a cosine down to a tenth of the peak at the last step."""
    warmup = max(1, steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


# -- training ----------------------------------------------------------------------------

class StepClock:
    """Samples/s over the intervals from one step's end to the next's, after the first
    `skip` steps (they pay for lazy set-up) and within epochs (the validation between them
    is left out): one measure for the script alone, under polyrhythm and under DDP."""

    def __init__(self, skip: int, samples_per_step: int) -> None:
        self.skip, self.samples_per_step = skip, samples_per_step
        self.steps, self.intervals, self.seconds = 0, 0, 0.0
        self.last: float | None = None

    def new_epoch(self) -> None:
        self.last = None

    def stepped(self) -> None:
        now = time.perf_counter()
        self.steps += 1
        if self.last is not None and self.steps > self.skip:
            self.intervals, self.seconds = self.intervals + 1, self.seconds + now - self.last
        self.last = now

    def line(self) -> str:
        rate = self.intervals * self.samples_per_step / self.seconds if self.seconds else 0.0
        return (f"samples/s {rate:.1f} over {self.intervals} steps of {self.samples_per_step} "
                f"samples ({self.seconds:.3f} s)")


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, windows: CharWindows) -> tuple[float, float]:
    """The mean loss per character over every validation window, and the accuracy: the share
    of characters the model's most likely next character is."""
    model.eval()
    total, right, count = 0.0, 0, 0
    for x, y in torch.utils.data.DataLoader(windows, batch_size=64):
        logits = model(x)
        total += float(next_char_loss(logits, y)) * y.numel()
        right += int((logits.argmax(-1) == y).sum())
        count += y.numel()
    model.train()
    return total / count, right / count


def validation_loss(model: nn.Module, windows: CharWindows) -> float:
    """The mean loss per character over every validation window."""
    return evaluate(model, windows)[0]


def validation_line(loss: float, accuracy: float) -> str:
    return f"val_loss {loss:.4f} val_accuracy {accuracy:.4f}"


def train(args, model, opt, schedule, batches, epochs, windows, log, talk: bool,
          clock: StepClock, backward, clip) -> None:
    """The loop, as a single-process script has it: stops after `args.steps` steps.
    `backward(loss)` runs the step's backward; `clip(max_norm)` clips the gradient the step
    applies."""
    step = 0
    for _ in epochs:
        clock.new_epoch()
        for x, y in batches:
            loss = next_char_loss(model(x), y)
            backward(loss)
            if args.clip:
                clip(args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            schedule.step()
            clock.stepped()
            step += 1
            if talk and args.log_every and step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
        log(*evaluate(model, windows))
    if talk and args.measure_after is not None:
        print(clock.line(), flush=True)


def main(args: argparse.Namespace) -> None:
    train_set, validation, vocabulary = datasets(corpus(args.chars), args.context)
    job = pr.init()
    model, opt, schedule = build(args, vocabulary)
    model, opt = job.wrap(model, opt)
    batches = job.loader(train_set, batch_size=args.batch)
    epochs = job.epochs(math.ceil(args.steps / len(batches)))

    def log(val_loss: float, val_accuracy: float) -> None:
        job.log(val_loss=val_loss, val_accuracy=val_accuracy)
        if job.worker == 0:
            print(validation_line(val_loss, val_accuracy), flush=True)

    clock = StepClock(args.measure_after or 0, args.batch * job.workers)
    train(args, model, opt, schedule, batches, epochs, validation, log, job.worker == 0, clock,
          lambda loss: job.backward(loss, exchange=not args.clip), job.clip_grad_norm_)
    # The run's final model, evaluated once: the record's final figures are this model's.
    job.finish(evaluate=lambda final: dict(zip(("val_loss", "val_accuracy"),
                                               evaluate(final, validation), strict=True)))
    if args.save:
        job.save(args.save)


def ddp(args: argparse.Namespace) -> None:
    """The same training under torch's DistributedDataParallel, on the batches polyrhythm's
    loader gives each worker (its ShardSampler with the job's default seed, 0)."""
    import torch.distributed as dist

    from polyrhythm.runtime.worker.script_data import ShardSampler

    train_set, validation, vocabulary = datasets(corpus(args.chars), args.context)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt, schedule = build(args, vocabulary)
    sampler = ShardSampler(len(train_set), rank, dist.get_world_size(), seed=0)
    batches = torch.utils.data.DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    epochs = range(math.ceil(args.steps / len(batches)))

    def log(val_loss: float, val_accuracy: float) -> None:
        if rank == 0:
            print(validation_line(val_loss, val_accuracy), flush=True)

    clock = StepClock(args.measure_after or 0, args.batch * dist.get_world_size())
    if args.powersgd is None:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        # One bucket for the whole model (DDP's default splits one of 1 MiB off after the
        # first step). With two buckets under Gloo (torch 2.13, width 128) the hook failed
        # within 30 steps, with Gloo's "Received data size doesn't match expected size" (a
        # collective mismatch) or in a hang: likely each bucket's chain of three
        # all-reduces, issued from callbacks, reaching Gloo in different orders on the ranks.
        wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=ONE_BUCKET_MB)
        powersgd_hook(wrapped, args.powersgd)
    train(args, wrapped, opt, schedule, batches, epochs, validation, log, rank == 0, clock,
          torch.Tensor.backward,
          lambda max_norm: nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    if args.save and rank == 0:
        torch.save(model.state_dict(), args.save)
    dist.barrier()
    # Leave without DDP's teardown at interpreter exit, which now and then aborts the
    # process (SIGABRT, "terminate called without an active exception") after the work is
    # done; every rank's output is saved and flushed by now.
    sys.stdout.flush()
    os._exit(0)


def powersgd_hook(model, rank: int) -> None:
    """PyTorch's PowerSGD hook on a DDP model: rank-`rank` factors with error feedback and
    warm start, for matrices whose factors take under half of them (min_compression_rate 2,
    polyrhythm's rule), from the third step: 2 is the least start_powerSGD_iter the hook
    allows with error feedback or warm start, so its first 2 steps are all-reduced whole."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=2, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True)
    model.register_comm_hook(state, powersgd.powerSGD_hook)


if __name__ == "__main__":
    options = arguments()
    try:
        ddp(options) if options.ddp else main(options)
    except PolyrhythmError as error:
        sys.exit(f"char_lm: error: {error}")
