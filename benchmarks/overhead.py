"""How much throughput polyrhythm gives up against plain PyTorch on the same job.

Two comparisons, each measured side by side in one run of this script:

1. `bsp` with 1 worker and 1 parameter server against a plain single-process training loop.
   Every step of the polyrhythm worker ships its gradient to the server and waits for the new
   parameters, so the ratio prices the parameter-server round trip (target >= 0.95).
2. `allreduce` with 2 workers against PyTorch DistributedDataParallel with 2 processes, both on
   Gloo over loopback. The ratio prices polyrhythm's worker loop and its flat-gradient all-reduce
   against DDP's bucketed one (target >= 1.00).

Both sides of a comparison train the same model (same seed) on the same data with the same
global batch and optimizer, give each worker process the torch thread count a polyrhythm worker
gets (polyrhythm's own `set_threads`: cores // workers), and read their batches in the same order
(polyrhythm's own sharding functions). Throughput is measured as polyrhythm measures it:
samples over the seconds of each epoch's training loop, which excludes process start-up, data
loading, rendezvous and validation, summed over workers. Each epoch gives one cluster rate
(polyrhythm's `epoch_metrics`); the first `--warmup` epochs are dropped on both sides, and a
run's throughput is the median rate of the remaining epochs.

Every run, baseline or polyrhythm, happens in freshly spawned processes. Runs are interleaved
and the order within each pair alternates between repeats, so drift in machine load hits both
sides alike; the reported ratio is the median over repeats of the paired ratios. Medians at both
levels keep a burst of unrelated load on a small shared machine from deciding the result.

    python benchmarks/overhead.py            # about 1-3 minutes on 2 cores
    python benchmarks/overhead.py --quick    # smoke run for CI, well under 30 seconds
    python benchmarks/overhead.py --model resnet20 --dataset cifar10 --data-path PATH
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.queues import Queue

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import polyrhythm
from machine_load import OtherLoad, shared_warning  # benchmarks/, this script's folder
from polyrhythm.config import RunConfig, make_config
from polyrhythm.data.plan import DataPlan
from polyrhythm.data.sharding import (
    batch_slice,
    epoch_order,
    steps_per_epoch,
    worker_batch_sizes,
)
from polyrhythm.data.source import Dataset
from polyrhythm.models.build import build_model
from polyrhythm.runtime.job import set_threads, whole_data

HOST = "127.0.0.1"
RESULT_TIMEOUT_S = 600.0
QUICK_STEPS = 8  # steps per epoch in --quick mode

# One epoch of one worker: (samples, seconds of its training loop).
EpochTiming = tuple[int, float]


@dataclass
class WorkerResult:
    """What one baseline process reports: its torch thread count, its epoch timings and the
    seconds of its steps' phases (forward and backward, the optimizer's step) in all."""

    threads: int
    epochs: list[EpochTiming]
    phases: dict[str, float] = field(default_factory=dict)


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
    }


# --- the plain PyTorch baselines (run in spawned processes) ------------------------------------


def train_epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 data: tuple[DataPlan, Dataset], config, worker: int,
                 phases: dict[str, float]) -> list[EpochTiming]:
    """A textbook loop over this worker's shard, batches in polyrhythm's order, timed per epoch:
    the whole training set normalised once up front, as float32 (polyrhythm keeps bytes and
    normalises each batch)."""
    plan, train = data
    x, y = train.batch(slice(None))
    batch = worker_batch_sizes(config.batch_size, config.workers)[worker]
    shard = plan.shards[worker]
    steps = steps_per_epoch(len(train), config.batch_size, config.steps_per_epoch)
    timings = []
    phases.update(compute=0.0, step=0.0, steps=0)
    for epoch in range(config.epochs):
        order = epoch_order(shard, epoch, config.seed, worker)
        loss_sum = 0.0
        start = time.perf_counter()
        for step in range(steps):
            began = time.perf_counter()
            idx = torch.from_numpy(batch_slice(order, batch, step))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            computed = time.perf_counter()
            optimizer.step()
            loss_sum += loss.item()  # read every step, as a polyrhythm worker does
            phases["compute"] += computed - began
            phases["step"] += time.perf_counter() - computed
        phases["steps"] += steps
        timings.append((steps * batch, time.perf_counter() - start))
    return timings


def make_optimizer(model: torch.nn.Module, config) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=config.optimizer.lr,
                           momentum=config.optimizer.momentum,
                           weight_decay=config.optimizer.weight_decay)


def setup(values: dict) -> tuple[RunConfig, tuple[DataPlan, Dataset], torch.nn.Module]:
    """Config, threads, (data plan, training set) and the model polyrhythm starts from (same
    seeded init)."""
    config = make_config(values)
    set_threads(config, "worker", config.workers)  # exactly what a polyrhythm worker gets
    plan, train, _ = whole_data(config)
    return config, (plan, train), build_model(config.model, train.shape, train.classes,
                                              config.seed)


def plain_main(values: dict, results: Queue) -> None:
    """Baseline 1: one process, no communication at all."""
    config, train, model = setup(values)
    optimizer = make_optimizer(model, config)
    phases: dict[str, float] = {}
    epochs = train_epochs(model, optimizer, train, config, 0, phases)
    results.put((0, WorkerResult(torch.get_num_threads(), epochs, phases)))


def ddp_main(rank: int, values: dict, port: int, results: Queue) -> None:
    """Baseline 2: one rank of DistributedDataParallel on Gloo, over its own shard."""
    config, train, model = setup(values)
    dist.init_process_group("gloo", init_method=f"tcp://{HOST}:{port}", rank=rank,
                            world_size=config.workers, timeout=timedelta(seconds=300))
    try:
        model = DistributedDataParallel(model)
        optimizer = make_optimizer(model, config)
        dist.barrier()  # start together, as polyrhythm's ranks do
        phases: dict[str, float] = {}
        epochs = train_epochs(model, optimizer, train, config, rank, phases)
        results.put((rank, WorkerResult(torch.get_num_threads(), epochs, phases)))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def run_spawned(target: Callable, arg_lists: list[tuple]) -> list[WorkerResult]:
    """Run one spawned process per argument tuple; return what each reported, by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, results)) for args in arg_lists]
    for p in procs:
        p.start()
    reports: dict[int, WorkerResult] = {}
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    try:
        while len(reports) < len(procs):
            try:
                rank, report = results.get(timeout=1.0)
                reports[rank] = report
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"baseline {target.__name__} failed "
                                       f"(exit codes {[p.exitcode for p in procs]})") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return [reports[r] for r in range(len(procs))]


def epoch_rates(workers: list[WorkerResult]) -> list[float]:
    """Cluster samples/s of each epoch: the sum over workers, as polyrhythm's epoch_metrics."""
    epochs = zip(*(w.epochs for w in workers), strict=True)
    return [sum(samples / seconds for samples, seconds in epoch) for epoch in epochs]


# --- the two sides of each comparison ------------------------------------------------------------


def run_plain(values: dict) -> list[WorkerResult]:
    return run_spawned(plain_main, [(values,)])


def run_ddp(values: dict) -> list[WorkerResult]:
    port = free_port()
    return run_spawned(ddp_main, [(r, values, port) for r in range(values["workers"])])


def run_polyrhythm(values: dict, out: str, profile: dict) -> list[float]:
    summary = polyrhythm.train({**values, "out": out})
    worker = summary["per_worker"][0]
    steps = worker["steps"]
    profile.clear()
    profile.update({name: worker[f"{name}_s"] / steps for name in PROFILED if worker[f"{name}_s"]})
    if summary["servers"]:  # the server's update, per step of worker 0
        profile["server update"] = summary["update_s_per_server"][0] / steps
    return [epoch["samples_per_s"] for epoch in summary["epoch_metrics"]]


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
    other_load: list[float] = field(default_factory=list)  # cores, one entry per run
    # The latest run's seconds per step by phase, worker 0's, for --profile.
    baseline_profile: dict[str, float] = field(default_factory=dict)
    polyrhythm_profile: dict[str, float] = field(default_factory=dict)

    def measure(self, repeat: int, out: str, warmup: int) -> None:
        """One paired measurement; the side that goes first alternates between repeats."""
        sides = [(self._run_baseline, self.baseline_rates),
                 (lambda: run_polyrhythm(self.values, out, self.polyrhythm_profile),
                  self.polyrhythm_rates)]
        for run, rates in sides if repeat % 2 == 0 else reversed(sides):
            with OtherLoad() as load:
                epochs = run()
            rates.append(steady_rate(epochs, warmup))
            if load.cores is not None:
                self.other_load.append(load.cores)

    def _run_baseline(self) -> list[float]:
        workers = self.baseline(self.values)
        self.threads = workers[0].threads
        phases = dict(workers[0].phases)
        steps = phases.pop("steps")
        self.baseline_profile = {name: seconds / steps for name, seconds in phases.items()}
        return epoch_rates(workers)

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
    parser.add_argument("--profile", action="store_true",
                        help="also print one step of each side by phase, in ms")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs, args.warmup = 1, 2, 1
        args.steps_per_epoch = min(args.steps_per_epoch or QUICK_STEPS, QUICK_STEPS)
    if not 0 <= args.warmup < args.epochs:
        parser.error("--warmup must leave at least one measured epoch")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
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
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polyrhythm-bench-") as out:
        for repeat in range(args.repeats):
            for c in comps:
                c.measure(repeat, out, args.warmup)
                load = ", ".join(f"{x:.2f}" for x in c.other_load[-2:]) or "?"
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


def warn_if_shared(comps: list[Comparison]) -> None:
    warning = shared_warning([x for c in comps for x in c.other_load])
    if warning:
        print(warning)


if __name__ == "__main__":
    sys.exit(main())
