"""The plain PyTorch baselines benchmarks/overhead.py measures polyrhythm against: a textbook
single-process loop, and DistributedDataParallel on Gloo. Each runs in freshly spawned
processes, with polyrhythm's data, batch order, seeded model and thread count, and reports its
epochs' timings."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.queues import Queue

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

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

# One epoch of one worker: (samples, seconds of its training loop).
EpochTiming = tuple[int, float]


@dataclass
class WorkerResult:
    """What one baseline process reports: its torch thread count, its epoch timings and the
    seconds of its steps' phases (forward and backward, the optimizer's step) in all."""

    threads: int
    epochs: list[EpochTiming]
    phases: dict[str, float] = field(default_factory=dict)


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


def run_spawned(target: Callable, arg_lists: list[tuple]) -> list:
    """Run one spawned process per argument tuple; return what each reported, by rank. Where
    anything fails or is interrupted (Ctrl-C), every process is killed with the processes
    it started (a process that leads a process group of its own: its group)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, results)) for args in arg_lists]
    for p in procs:
        p.start()
    reports: dict[int, object] = {}
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    try:
        while len(reports) < len(procs):
            try:
                rank, report = results.get(timeout=1.0)
                reports[rank] = report
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"{target.__name__} failed "
                                       f"(exit codes {[p.exitcode for p in procs]})") from None
    except BaseException:
        for p in procs:
            kill_with_group(p)
        raise
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                kill_with_group(p)
                p.join()
    return [reports[r] for r in range(len(procs))]


def kill_with_group(process) -> None:
    """SIGKILL `process`'s process group where it leads one, else the process alone."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def epoch_rates(workers: list[WorkerResult]) -> list[float]:
    """Cluster samples/s of each epoch: the sum over workers, as polyrhythm's epoch_metrics."""
    epochs = zip(*(w.epochs for w in workers), strict=True)
    return [sum(samples / seconds for samples, seconds in epoch) for epoch in epochs]


def run_plain(values: dict) -> list[WorkerResult]:
    return run_spawned(plain_main, [(values,)])


def run_ddp(values: dict) -> list[WorkerResult]:
    port = free_port()
    return run_spawned(ddp_main, [(r, values, port) for r in range(values["workers"])])
