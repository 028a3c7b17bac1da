"""What every process of a job does once it has joined the job, whoever launched it: build its
role (worker or server shard), run it, and gather every rank's report to rank 0, which turns
them into the run's result. Joining and leaving the job is launch/rank.py's.
"""

from __future__ import annotations

import os
import time

import torch

from polyrhythm.config.emulation import host_ranks, per_host
from polyrhythm.context import RankContext
from polyrhythm.data.datasets import Dataset, load_dataset, train_val_split
from polyrhythm.data.sharding import steps_per_epoch
from polyrhythm.flat import BucketLayout, FlatParameters
from polyrhythm.metrics.sampler import ResourceSampler
from polyrhythm.models.build import build_model
from polyrhythm.runtime.server import ParameterServerShard
from polyrhythm.runtime.summary import RunResult, summarise
from polyrhythm.runtime.worker import Worker
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.spec import SWITCHING


def prepare_data(config) -> tuple[Dataset, Dataset]:
    """The training and validation sets; identical on every process for a given seed."""
    data = load_dataset(config.data, config.seed)
    return train_val_split(data, config.data.val_fraction, config.seed)


def set_threads(config, role: str, local_workers: int, rank: int | None = None) -> None:
    """Workers share their host's cores; servers mostly wait, so one thread each is enough."""
    if role == "server":
        threads = 1
    else:
        threads = config.threads or max(1, int(host_cores(config, rank)
                                                // max(1, local_workers)))
    torch.set_num_threads(threads)


def host_cores(config, rank: int | None) -> float:
    """The cores rank `rank`'s host has: the machine's, or fewer on an emulated host with a
    smaller CPU share (more threads than its quota only queue for it)."""
    cores = os.cpu_count() or 1
    cluster = config.cluster
    if rank is None or not cluster.hosts or not cluster.cpu:
        return cores
    layout = host_ranks(cluster, config.servers, config.workers)
    host = next(h for h, ranks in enumerate(layout) if rank in ranks)
    return min(cores, per_host(cluster.cpu, cluster.hosts)[host])


def build_role(ctx: RankContext, train: Dataset, val: Dataset) -> Worker | ParameterServerShard:
    """This rank's role, as the topology says: a worker, or one parameter-server shard."""
    if ctx.topology.role(ctx.rank) == "worker":
        return Worker(ctx, train, val)
    config = ctx.config
    initial = FlatParameters(build_model(config.model, train.shape, train.classes, config.seed))
    layout = BucketLayout(len(initial), config.servers, config.bucket_kb)
    spec, workers = STRATEGIES[config.strategy.name], config.workers
    steps = steps_per_epoch(len(train), config.batch_size, config.steps_per_epoch)
    return ParameterServerShard(ctx, initial.data, layout.of_server(ctx.rank),
                                layout.capacity(ctx.rank),
                                lambda: spec.policy(config.strategy, workers), steps,
                                handover=spec.family == SWITCHING)


def run_rank(ctx: RankContext, local_workers: int | None = None) -> RunResult | None:
    """Play this rank's role in the job; rank 0 returns the run's result, others None."""
    config = ctx.config
    set_threads(config, ctx.topology.role(ctx.rank), local_workers or config.workers, ctx.rank)
    train, val = prepare_data(config)
    role = build_role(ctx, train, val)  # before the clock starts: building is set-up
    ctx.transport.barrier()  # start the clock when every process is ready
    ctx.started, trained_from = time.perf_counter(), time.time()
    if config.instrumentation:
        with ResourceSampler(ctx.rank, ctx.topology.role(ctx.rank), ctx.now,
                             ctx.transport.counters.moved) as sampler:
            report = role.run()
        report["resources"] = sampler.samples
    else:
        report = role.run()
    reports = ctx.transport.gather_object(report, dst=0)
    if ctx.rank != 0:
        return None
    result = summarise(config, reports, val, ctx.now())
    # When training ran, by the wall clock: what an emulated cluster's fidelity guard judges.
    result.summary["training_window"] = [trained_from, time.time()]
    return result
