"""What every process of a job runs, whoever launched it (local launcher or torchrun).

The process group must already be initialised. Each rank plays its role, then all reports are
gathered to rank 0, which turns them into the run's summary.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from polyrhythm.context import ProgressSink, RankContext, Topology, no_progress
from polyrhythm.data.datasets import Dataset, load_dataset, train_val_split
from polyrhythm.data.sharding import steps_per_epoch
from polyrhythm.flat import BucketLayout, FlatParameters
from polyrhythm.metrics.sampler import ResourceSampler
from polyrhythm.models import build_model
from polyrhythm.server import ParameterServerShard
from polyrhythm.strategies import STRATEGIES
from polyrhythm.summary import RunResult, summarise
from polyrhythm.worker import Worker


def prepare_data(config) -> tuple[Dataset, Dataset]:
    """The training and validation sets; identical on every process for a given seed."""
    return train_val_split(load_dataset(config), config.val_fraction, config.seed)


def set_threads(config, role: str, local_workers: int) -> None:
    """Workers share the cores; servers mostly wait, so one thread each is enough."""
    if role == "server":
        threads = 1
    else:
        threads = config.threads or max(1, (os.cpu_count() or 1) // max(1, local_workers))
    torch.set_num_threads(threads)


def run_rank(config, rank: int, progress: ProgressSink = no_progress,
             local_workers: int | None = None) -> RunResult | None:
    """Play this rank's role in the job; rank 0 returns the run's result, others None."""
    topology = Topology(config.servers, config.workers)
    ctx = RankContext(config, rank, topology, progress=progress)
    set_threads(config, topology.role(rank), local_workers or config.workers)
    train, val = prepare_data(config)
    role = _build_role(ctx, train, val)  # before the clock starts: building is set-up
    dist.barrier()  # start the clock when every process is ready
    ctx.started = time.perf_counter()
    if config.instrumentation:
        with ResourceSampler(ctx) as sampler:
            report = role.run()
        report["resources"] = sampler.samples
    else:
        report = role.run()
    reports = [None] * topology.world_size if rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    if rank != 0:
        return None
    return summarise(config, reports, val, ctx.now())


def _build_role(ctx: RankContext, train: Dataset, val: Dataset) -> Worker | ParameterServerShard:
    if ctx.topology.role(ctx.rank) == "worker":
        return Worker(ctx, train, val)
    config = ctx.config
    initial = FlatParameters(build_model(config.model, train.shape, train.classes, config.seed))
    layout = BucketLayout(len(initial), config.servers, config.bucket_kb)
    spec = STRATEGIES[config.strategy]
    steps = steps_per_epoch(len(train), config.batch_size, config.steps_per_epoch)
    return ParameterServerShard(ctx, initial.data, layout.of_server(ctx.rank),
                                layout.capacity(ctx.rank), lambda: spec.policy(config), steps)
