"""What checkpoint digests cost: a checkpoint written with them against without, and a
resume's check of one.

The checkpoint is what a run of 1 worker writes after its first epoch, of `--model`
(default resnet50, about 94 MB of float32 weights): `model.pt` (the model and its momentum,
as plain PyTorch loads them), `worker-0.pt` (the worker's state: the same model and momentum,
its random state and records) and the epoch's model snapshot (`snapshots/`, the flat model),
each written by `checkpoint.save`. A resume's check is `latest` on that run's folder: now,
each file's SHA-256 against its digest (the snapshot's too); before digests, torch.load of
every checkpoint file.

Method: each side is a process of its own, started with its checkout's src/ first on the
path: this checkout's ("now") and, with `--against CHECKOUT`, another's ("before"), driven
in turn on the same disk. Each repeat, each side writes the checkpoint into a fresh folder
(fsync'd, as a run writes it), then checks it twice: with its files still in the page cache
(just written), and after dropping them from it (posix_fadvise DONTNEED), read from disk as
a resume after a restart reads them. The side that goes first swaps each repeat. Reported:
each figure's median over repeats, and the median of the paired ratios now/before. Without
`--against`, this checkout alone, beside the SHA-256 of the same bytes in memory.

    python benchmarks/checkpoints.py                          # this checkout, resnet50
    git worktree add /tmp/before REV
    python benchmarks/checkpoints.py --against /tmp/before    # now against REV
    python benchmarks/checkpoints.py --quick   # smoke run: resnet20, 1 repeat, against itself
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import OtherLoad, shared_warning  # benchmarks/

HERE = Path(__file__).resolve()
FIGURES = ("write", "check", "check_disk")  # seconds: a checkpoint written; checked twice
NAMES = {"write": "checkpoint written", "check": "resume's check, cached",
         "check_disk": "resume's check, from disk"}


def _states(model_name: str) -> tuple[dict[str, dict], int]:
    """The checkpoint's files' states (as a worker writes them), and the parameters' count."""
    import torch

    from polyrhythm.models import resnet

    torch.manual_seed(0)
    model = getattr(resnet, model_name)((3, 32, 32), 10)
    named = list(model.named_parameters())
    momentum = [torch.randn_like(p) for _, p in named]
    flat_momentum = torch.cat([m.reshape(-1) for m in momentum])
    groups = [{"params": list(range(len(named))), "param_names": [n for n, _ in named]}]
    plain = {"model": model.state_dict(),
             "optimizer": {"state": {i: {"momentum_buffer": m} for i, m in enumerate(momentum)},
                           "param_groups": groups}}
    worker = {"worker": {"model": model.state_dict(), "rng": torch.get_rng_state(),
                         "strategy": {"optimizer": {"momentum_buffer": flat_momentum}},
                         "taken": 782},
              "epochs": [{"epoch": 1, "train_loss": 2.0, "wall_s": 100.0}],
              "iterations": torch.zeros(782, 6, dtype=torch.float64)}
    snapshot = {"snapshot": torch.cat([p.detach().reshape(-1) for _, p in named])}
    return {"model": plain, "worker": worker, "snapshot": snapshot}, flat_momentum.numel()


def side(model_name: str) -> None:
    """One side's process: answers each request line on stdin with one JSON line."""
    from polyrhythm.runtime import checkpoint

    try:  # where this checkout keeps `latest` (runtime/intact.py since digests)
        from polyrhythm.runtime.intact import latest
    except ImportError:
        from polyrhythm.runtime.checkpoint import latest
    states, parameters = _states(model_name)
    print(json.dumps({"parameters": parameters}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        run = Path(request["run"])
        if request["do"] == "write":
            paths = [checkpoint.epoch_dir(run, 1) / checkpoint.MODEL,
                     checkpoint.epoch_dir(run, 1) / "worker-0.pt",
                     checkpoint.snapshot_file(run, 0, 0)]
            began = time.perf_counter()
            for path, state in zip(paths, states.values(), strict=True):
                checkpoint.save(state, path)
            seconds = time.perf_counter() - began
            print(json.dumps({"s": seconds, "mb": [p.stat().st_size / 1e6 for p in paths]}),
                  flush=True)
            continue
        if request["do"] == "check_disk":
            _drop_from_cache(run)
        began = time.perf_counter()
        _, done = latest(run, 1, 0, say=lambda line: None)
        print(json.dumps({"s": time.perf_counter() - began, "done": done}), flush=True)


def _drop_from_cache(run: Path) -> None:
    """Drop the run's files from the page cache (written and fsync'd: clean pages)."""
    for path in run.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Side:
    """A side's process, with its checkout's src/ first on its path."""

    def __init__(self, label: str, checkout: Path, model_name: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(checkout / "src"), os.environ.get("PYTHONPATH", "")])}
        self.label = label
        self.proc = subprocess.Popen([sys.executable, str(HERE), "--side", "--model",
                                      model_name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.parameters = self._answer()["parameters"]

    def ask(self, do: str, run: Path) -> dict:
        self.proc.stdin.write(json.dumps({"do": do, "run": str(run)}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.label} side ended (exit code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def repeat(sides: list[Side], root: Path, first: int) -> tuple[dict, list[float]]:
    """Each side's figures for one repeat ({label: {figure: seconds}}), and the files' MB."""
    got, sizes = {}, []
    for s in sides[first:] + sides[:first]:
        run = Path(tempfile.mkdtemp(dir=root, prefix=f"{s.label}-"))
        written = s.ask("write", run)
        sizes = sizes or written["mb"]
        got[s.label] = {"write": written["s"]}
        for figure in ("check", "check_disk"):
            answer = s.ask(figure, run)
            if answer["done"] != 1:
                raise SystemExit(f"the {s.label} side did not trust its checkpoint")
            got[s.label][figure] = answer["s"]
        shutil.rmtree(run)
    return got, sizes


def hash_seconds(megabytes: float) -> float:
    """The SHA-256 of that many MB in memory (hashlib, as the digests take it)."""
    data = os.urandom(1 << 20) * max(1, round(megabytes))
    began = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return time.perf_counter() - began


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a resnet of models/resnet.py "
                        "(default resnet50)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (default 5)")
    parser.add_argument("--against", metavar="CHECKOUT", type=Path,
                        help="another checkout of polyrhythm (before digests): each figure "
                        "of this one against the same of that one")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the checkpoints are written (default: the system's "
                        "temporary folder; put it on the disk your runs use)")
    parser.add_argument("--quick", action="store_true", help="smoke run: resnet20, 1 repeat, "
                        "against this checkout itself unless --against says another")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.repeats = "resnet20", 1
        args.against = args.against or HERE.parent.parent
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.against is not None and not (args.against / "src" / "polyrhythm").is_dir():
        parser.error(f"--against {args.against}: not a checkout of polyrhythm")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        side(args.model)
        return
    sides = [Side("now", HERE.parent.parent, args.model)]
    if args.against is not None:
        sides.append(Side("before", args.against.resolve(), args.model))
    runs, sizes, loads = [], [], []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="checkpoints-bench-") as root:
        for r in range(args.repeats):
            with OtherLoad() as load:
                got, sizes = repeat(sides, Path(root), r % len(sides))
            runs.append(got)
            loads += [load.cores] if load.cores is not None else []
            print(f"  repeat {r + 1}/{args.repeats}  " + "  ".join(
                f"{label}: write {f['write']:.3f} s, check {f['check']:.3f} s, from disk "
                f"{f['check_disk']:.3f} s" for label, f in got.items())
                + (f"  other load {load.cores:.2f}" if load.cores is not None else ""),
                flush=True)
    for s in sides:
        s.close()
    report(args, sides[0].parameters, sizes, runs)
    if warning := shared_warning(loads):
        print(warning)


def report(args: argparse.Namespace, parameters: int, sizes: list[float],
           runs: list[dict]) -> None:
    total = sum(sizes)
    print(f"{args.model} ({parameters / 1e6:.1f}M parameters), a checkpoint after epoch 1 of "
          f"a 1-worker run: model.pt {sizes[0]:.1f} MB, worker-0.pt {sizes[1]:.1f} MB, "
          f"snapshot {sizes[2]:.1f} MB; median of {args.repeats} repeats, the sides in turn")
    against = args.against is not None
    for figure in FIGURES:
        now = statistics.median(run["now"][figure] for run in runs)
        line = f"{NAMES[figure]:<27} now {now:8.3f} s"
        if against:
            before = statistics.median(run["before"][figure] for run in runs)
            ratios = [run["now"][figure] / run["before"][figure] for run in runs]
            line += (f"  before {before:8.3f} s  ratio {statistics.median(ratios):.3f}  "
                     f"[repeats: {min(ratios):.3f}-{max(ratios):.3f}]")
        print(line)
    print(f"SHA-256 of the checkpoint's {total:.1f} MB in memory: {hash_seconds(total):.3f} s")


if __name__ == "__main__":
    main()
