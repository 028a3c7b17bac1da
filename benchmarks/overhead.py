"""How much throughput polyrhythm gives up against plain PyTorch on the same job.

Two comparisons, each measured side by side in one run of this script:

1. `bsp` with 1 worker and 1 parameter server against a plain single-process training loop.
   Every step of the polyrhythm worker ships its gradient to the server and waits for the new
   parameters, so the ratio prices the parameter-server round trip (target >= 0.95).
2. `allreduce` with 2 workers against PyTorch DistributedDataParallel with 2 processes, both on
   Gloo over loopback. The ratio prices polyrhythm's worker loop and its flat-gradient all-reduce
   against DDP's bucketed one (target >= 1.00).

Both sides of a comparison train the same model (same seed) on the same data with the same
global batch and optimizer, and read their batches in the same order (polyrhythm's own sharding
functions). Throughput is measured as polyrhythm measures it: samples over the seconds of each
epoch's training loop, which excludes process start-up, data loading, rendezvous and
validation, summed over workers. Each epoch gives one cluster rate (polyrhythm's
`epoch_metrics`); the first `--warmup` epochs are dropped on both sides, and a run's throughput
is the median rate of the remaining epochs.

Method (as benchmarks/script.py): the two sides of a comparison run at the same time, each in
freshly spawned processes pinned to a core of its own (every process of a side, server and
workers alike, shares its core) with one torch thread a process, so both see the same drift in
the speed of a shared machine; the cores swap between repeats. The reported ratio is the median
over repeats of the paired ratios. `--in-turn` runs the sides one after the other instead, on
every core, each worker process with the threads a polyrhythm worker gets (cores // workers):
the setting a user's run has, but a VM whose speed moves by 10-40 % from minute to minute
moves the ratio as much.

    python benchmarks/overhead.py            # about 1-3 minutes on 2 cores
    python benchmarks/overhead.py --quick    # smoke run for CI, well under 30 seconds
    python benchmarks/overhead.py --model resnet20 --dataset cifar10 --data-path PATH

`--gate` measures instead what the run's secret costs (benchmarks/gated.py): a job's ranks
joining through rank 0's gate against torch's own store, their rendezvous and their steps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import forkserver

import torch

import polyrhythm
from baselines import WorkerResult, epoch_rates, run_ddp, run_plain, run_spawned  # benchmarks/
from gated import GateCost  # benchmarks/
from machine_load import OtherLoad, shared_warning

QUICK_STEPS = 8  # steps per epoch in --quick mode
JOINS_A_REPEAT = 20  # --gate: rendezvous pairs for each run pair


def job_values(strategy: str, workers: int, args: argparse.Namespace) -> dict:
    """The run config both sides of a comparison are built from."""
    return {
        "strategy": strategy,
        "workers": workers,
        "model": args.model,
        "dataset": args.dataset,
        "batch_size": args.batch_size,
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "epochs": args.epochs,
        "steps_per_epoch": args.steps_per_epoch,
        "seed": args.seed,
        **({"data_path": args.data_path} if args.data_path else {}),
        **({"bucket_kb": args.bucket_kb} if args.bucket_kb and strategy == "bsp" else {}),
        **({"threads": args.threads} if args.threads else {}),
    }


def run_side(side: str, values: dict, baseline: Callable, out: str) -> tuple:
    """Run one side: its epochs' samples/s, the torch threads of its worker processes (the
    baseline's report them) and worker 0's seconds per step by phase (for --profile)."""
    if side == "baseline":
        workers = baseline(values)
        phases = dict(workers[0].phases)
        steps = phases.pop("steps")
        return (epoch_rates(workers), workers[0].threads,
                {name: seconds / steps for name, seconds in phases.items()})
    summary = polyrhythm.train({**values, "out": out})
    worker = summary["per_worker"][0]
    steps = worker["steps"]
    profile = {name: worker[f"{name}_s"] / steps for name in PROFILED if worker[f"{name}_s"]}
    if summary["servers"]:  # the server's update, per step of worker 0
        profile["server update"] = summary["update_s_per_server"][0] / steps
    return [epoch["samples_per_s"] for epoch in summary["epoch_metrics"]], 0, profile


def pinned_side(index: int, core: int, side: str, values: dict, baseline: Callable, out: str,
                results) -> None:
    """`run_side` in a process pinned to `core`, leading a process group: every process it
    starts inherits the pin and the group. It ends the forkserver polyrhythm's ranks came
    from and waits for it, so that their CPU seconds reach this benchmark's own (OtherLoad
    counts the rest of the machine's)."""
    os.setpgrp()  # so that the benchmark can end them all, should anything fail
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {core})
    outcome = run_side(side, values, baseline, out)
    pid = forkserver._forkserver._forkserver_pid
    if pid:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    results.put((index, outcome))


PROFILED = ("compute", "push", "wait", "pull", "apply")  # a worker's spans (metrics/recorder.py)


def steady_rate(rates: list[float], warmup: int) -> float:
    """A run's samples/s: the median epoch rate after warm-up (robust to bursts of other load)."""
    return statistics.median(rates[warmup:])


@dataclass
class Comparison:
    """One polyrhythm configuration against its plain PyTorch baseline."""

    name: str
    baseline_name: str
    values: dict
    baseline: Callable[[dict], list[WorkerResult]]
    target: float
    threads: int = 0  # torch threads per worker, as the baseline processes report them
    baseline_rates: list[float] = field(default_factory=list)
    polyrhythm_rates: list[float] = field(default_factory=list)
    other_load: list[float] = field(default_factory=list)  # cores, one entry per repeat
    # The latest run's seconds per step by phase, worker 0's, for --profile.
    baseline_profile: dict[str, float] = field(default_factory=dict)
    polyrhythm_profile: dict[str, float] = field(default_factory=dict)

    def measure(self, repeat: int, out: str, warmup: int, cores: list[int]) -> None:
        """One paired measurement: both sides at once, a core each (the cores swap between
        repeats), or with a single core given, one after the other (the order swapping)."""
        sides = ["baseline", "polyrhythm"]
        if repeat % 2:
            sides.reverse()
        with OtherLoad() as load:
            if len(cores) > 1:
                outcomes = run_spawned(pinned_side, [(i, core, side, self.values,
                                                      self.baseline, out)
                                                     for i, (side, core) in
                                                     enumerate(zip(sides, cores, strict=True))])
            else:
                outcomes = [run_side(side, self.values, self.baseline, out) for side in sides]
        for side, (rates, threads, profile) in zip(sides, outcomes, strict=True):
            if side == "baseline":
                self.threads, self.baseline_profile = threads, profile
                self.baseline_rates.append(steady_rate(rates, warmup))
            else:
                self.polyrhythm_profile = profile
                self.polyrhythm_rates.append(steady_rate(rates, warmup))
        if load.cores is not None:
            self.other_load.append(load.cores)

    def print_profile(self) -> None:
        """One step of worker 0 on each side, by phase: where the difference goes."""
        print(f"{self.name} against {self.baseline_name}: ms per step (latest repeat, worker 0, "
              "warm-up included)")
        for side, profile in ((self.baseline_name, self.baseline_profile),
                              (f"polyrhythm {self.name}", self.polyrhythm_profile)):
            phases = "  ".join(f"{name} {seconds * 1e3:.3f}" for name, seconds in profile.items())
            print(f"  {side:<34} {phases}")

    @property
    def ratios(self) -> list[float]:
        return [p / b for p, b in zip(self.polyrhythm_rates, self.baseline_rates, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def comparisons(args: argparse.Namespace) -> list[Comparison]:
    return [
        Comparison("bsp, 1 worker + 1 server", "plain loop, 1 process",
                   {**job_values("bsp", 1, args), "servers": 1}, run_plain, 0.95),
        Comparison("allreduce, 2 workers", "DDP (Gloo), 2 processes",
                   job_values("allreduce", 2, args), run_ddp, 1.00),
    ]


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4,
                        help="epochs per run, warm-up included (default 4)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="leading epochs left out of the throughput (default 1)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="paired measurements per comparison (default 3)")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="cap on steps per epoch (default: a full pass over the data)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: 1 repeat, 2 epochs of {QUICK_STEPS} steps")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--data-path", help="cifar10, cifar100, npz: the data file or folder")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-kb", type=int, default=None,
                        help="bsp's bucket size (default: polyrhythm's)")
    parser.add_argument("--in-turn", action="store_true",
                        help="run the two sides one after the other on every core (default: "
                             "at once, a core each, one torch thread a process)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads a worker process (default: 1 side by side; in "
                             "turn, what a polyrhythm worker gets: cores // workers)")
    parser.add_argument("--profile", action="store_true",
                        help="also print one step of each side by phase, in ms")
    parser.add_argument("--gate", action="store_true",
                        help="measure instead what the run's secret costs: allreduce's 2 ranks "
                             "joining through rank 0's gate against torch's own store, paired "
                             "(their rendezvous, 20 pairs a repeat; their steps)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs, args.warmup = 1, 2, 1
        args.steps_per_epoch = min(args.steps_per_epoch or QUICK_STEPS, QUICK_STEPS)
    if not 0 <= args.warmup < args.epochs:
        parser.error("--warmup must leave at least one measured epoch")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.threads is None and not args.in_turn:
        args.threads = 1
    return args


def print_table(comps: list[Comparison]) -> None:
    header = (f"{'polyrhythm':<26} {'baseline':<24} {'threads':>7} {'baseline/s':>11} "
              f"{'polyrhythm/s':>12} {'ratio':>6} {'target':>6}  verdict")
    print(header)
    print("-" * len(header))
    for c in comps:
        verdict = "PASS" if c.ratio >= c.target else "BELOW"
        print(f"{c.name:<26} {c.baseline_name:<24} {c.threads:>7} "
              f"{statistics.median(c.baseline_rates):>11.0f} "
              f"{statistics.median(c.polyrhythm_rates):>12.0f} "
              f"{c.ratio:>6.3f} {c.target:>6.2f}  {verdict}")
    print("samples/s: median over repeats; ratio: median of the paired per-repeat ratios")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comps = comparisons(args)
    steps = args.steps_per_epoch or "all"
    print(f"{args.model} on {args.dataset}, global batch {args.batch_size}, {args.epochs} epochs "
          f"({args.warmup} warm-up) of {steps} steps, {args.repeats} repeats, "
          f"{os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    cores = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else [0]
    if args.in_turn or len(cores) < 2:
        cores = cores[:1]
        how = "the sides in turn, each on every core"
    else:
        how = "the sides at once, a core each"
    threads = (f"{args.threads} torch thread(s) a worker process" if args.threads else
               "the torch threads a polyrhythm worker gets (cores // workers)")
    print(f"{how}; {threads}", flush=True)
    started = time.perf_counter()
    if args.gate:
        return gate_cost(args, cores, started)
    with tempfile.TemporaryDirectory(prefix="polyrhythm-bench-") as out:
        for repeat in range(args.repeats):
            for c in comps:
                c.measure(repeat, out, args.warmup, cores)
                load = f"{c.other_load[-1]:.2f}" if c.other_load else "?"
                print(f"  repeat {repeat + 1}/{args.repeats}  {c.name:<26} "
                      f"baseline {c.baseline_rates[-1]:7.0f}/s  "
                      f"polyrhythm {c.polyrhythm_rates[-1]:7.0f}/s  "
                      f"ratio {c.ratios[-1]:.3f}  other load {load} cores", flush=True)
    print(f"\nmeasured in {time.perf_counter() - started:.0f} s\n")
    print_table(comps)
    if args.profile:
        print()
        for c in comps:
            c.print_profile()
    if args.quick:
        print("--quick is a smoke run: its epochs are too short for the ratios to mean much")
    warn_if_shared(comps)
    return 0


def gate_cost(args: argparse.Namespace, cores: list[int], started: float) -> int:
    """--gate: what the run's secret costs, paired (benchmarks/gated.py)."""
    cost = GateCost()
    with tempfile.TemporaryDirectory(prefix="polyrhythm-bench-") as out, OtherLoad() as load:
        cost.measure(JOINS_A_REPEAT * args.repeats, args.repeats,
                     job_values("allreduce", 2, args), out, args.warmup, cores)
    print(f"\nmeasured in {time.perf_counter() - started:.0f} s\n")
    cost.print_table()
    if load.cores is not None:
        warning = shared_warning([load.cores])
        if warning:
            print(warning)
    return 0


def warn_if_shared(comps: list[Comparison]) -> None:
    warning = shared_warning([x for c in comps for x in c.other_load])
    if warning:
        print(warning)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # every side's processes are gone already (run_spawned)
        print("overhead.py: interrupted", file=sys.stderr)
        sys.exit(130)
