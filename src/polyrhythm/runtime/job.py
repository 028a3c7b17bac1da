"""The roles a job's ranks play once they have joined it: the data plan the workers agree
on, polyrhythm train's roles (its workers, and servers of the model its config builds), any
job's servers (`serve`, from what they serve: a script's servers learn it from the first
worker), playing a role to its report, and how polyrhythm train's job ends (its result).
A rank's life around them, from joining to leaving, is launch/rank/life.py's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from polyrhythm.compression.wire import bucket_words
from polyrhythm.config.emulation import host_ranks, per_host
from polyrhythm.context import RankContext
from polyrhythm.data.datasets import open_source
from polyrhythm.data.plan import DataPlan, load_part, load_val, make_plan
from polyrhythm.data.sharding import steps_per_epoch
from polyrhythm.data.source import Dataset, Source
from polyrhythm.flat import FlatParameters
from polyrhythm.layout import BucketLayout
from polyrhythm.metrics.sampler import ResourceSampler
from polyrhythm.models.build import build_model
from polyrhythm.optim import StateKeys
from polyrhythm.runtime.server.bucket import MakeUpdater
from polyrhythm.runtime.server.server import ParameterServerShard
from polyrhythm.runtime.summary import RunResult, summarise
from polyrhythm.runtime.survivors import agree_on_lost
from polyrhythm.runtime.worker.builtin import BuiltinWorker
from polyrhythm.runtime.worker.script import lasting
from polyrhythm.runtime.worker.user_optimizer import OptimizerSpec
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.spec import SWITCHING

# Servers learn the length of an epoch from a script's loader; without one, an epoch is this
# many steps for them (what only fixed-round strategies read: those need a loader).
UNKNOWN_STEPS = 10**9


def plan_data(config, source: Source | None = None) -> DataPlan:
    """The run's data plan (data/plan.py), from its source."""
    source = source or open_source(config.data, config.seed)
    return make_plan(source, config.data, config.workers, config.seed, config.loss)


def whole_data(config) -> tuple[DataPlan, Dataset, Dataset]:
    """(plan, the whole training set, the validation set): a single-process view."""
    source = open_source(config.data, config.seed)
    plan = plan_data(config, source)
    return (plan, *load_part(source, plan, None))


def agree_on_plan(ctx: RankContext) -> tuple[DataPlan, Source | None]:
    """The run's data plan, made once by the first worker and sent to every rank, and this
    rank's source of data (None on a server: it reads none)."""
    config, first = ctx.config, ctx.topology.worker_ranks[0]
    source = None
    if ctx.topology.role(ctx.rank) == "worker":
        source = open_source(config.data, config.seed)
    plan = plan_data(config, source) if ctx.rank == first else None
    return ctx.transport.broadcast_object(plan, src=first), source


def set_threads(config, role: str, local_workers: int, rank: int | None = None) -> None:
    torch.set_num_threads(thread_count(config, role, local_workers, rank))


def thread_count(config, role: str, local_workers: int, rank: int | None = None) -> int:
    """Torch threads of a rank: workers share their host's cores (`local_workers` of them,
    rank `rank`'s host); servers mostly wait, so one thread each is enough."""
    if role == "server":
        return 1
    return config.threads or max(1, int(host_cores(config, rank) // max(1, local_workers)))


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


@dataclass(frozen=True)
class Served:
    """What a job's parameter servers serve: the flat model they start from (`initial`, of
    parameters of `shapes`), an epoch's steps (None: unknown) and the run's epochs (None:
    the config's), and the optimizer their buckets step: a script's, rebuilt on their slices
    (runtime/worker/user_optimizer.py OptimizerSpec), or None for the run's [optimizer]. A
    built-in job's servers make it from the config themselves; a script's learn it from the
    first worker, at its first step."""

    initial: torch.Tensor
    shapes: list[tuple[int, ...]]
    steps_per_epoch: int | None
    epochs: int | None = None
    optimizer: OptimizerSpec | None = None


def serve(ctx: RankContext, served: Served) -> ParameterServerShard:
    """This rank's parameter-server shard of what the job's servers serve: any job's server
    starts here."""
    if served.epochs:
        ctx.config = lasting(ctx.config, served.epochs)
    steps = served.steps_per_epoch or ctx.config.steps_per_epoch or UNKNOWN_STEPS
    optimizer = served.optimizer
    if optimizer is None:  # the run's own optimizer, from the config
        return server_shard(ctx, served.initial, steps, served.shapes)
    ctx.push_hyper_words = optimizer.push_words  # each push carries the script's settings
    return server_shard(ctx, served.initial, steps, served.shapes,
                        make_updater=lambda weights, a, b, concurrency:
                        optimizer.updater(weights, a, b),
                        handover_keys=optimizer.state_keys())


def build_role(ctx: RankContext, plan: DataPlan,
               source: Source | None) -> BuiltinWorker | ParameterServerShard:
    """This rank's role in polyrhythm train's job, as the topology says: a worker with its
    shard of the data, or one parameter-server shard (which reads no data) of the model the
    run's config builds: broadcasting it from a worker would cost minutes at the start on a
    slow emulated link."""
    config = ctx.config
    steps = steps_per_epoch(len(plan.train), config.batch_size, config.steps_per_epoch)
    if ctx.topology.role(ctx.rank) == "worker":
        return BuiltinWorker(ctx, *load_part(source, plan, ctx.worker_index), steps)
    initial = FlatParameters(build_model(config.model, plan.shape, plan.classes, config.seed,
                                         config.loss))
    return serve(ctx, Served(initial.data, initial.shapes, steps))


def server_shard(ctx: RankContext, initial: torch.Tensor, steps: int,
                 shapes: list[tuple[int, ...]], make_updater: MakeUpdater | None = None,
                 handover_keys: StateKeys | None = None) -> ParameterServerShard:
    """This rank's parameter-server shard of the flat model `initial`, of parameters of
    `shapes` (its buckets, as the layout gives them), under the run's strategy, with epochs
    of `steps` global batches; `make_updater`: its buckets' optimizer and `handover_keys` the
    state a Strategy-Switch hands it (the run's optimizer's by default)."""
    config = ctx.config
    layout = BucketLayout(len(initial), config.servers, config.bucket_kb)
    spec, workers = STRATEGIES[config.strategy.name], config.workers
    mine = layout.of_server(ctx.rank)
    pushes = bucket_words(config.compression, [(ctx.rank, a, b) for a, b in mine.values()],
                          shapes)
    return ParameterServerShard(ctx, initial, mine, max(pushes),
                                lambda: spec.policy(config.strategy, workers),
                                spec.server_updates(config.strategy, workers), steps,
                                handover=spec.family == SWITCHING, make_updater=make_updater,
                                handover_keys=handover_keys, shapes=shapes)


def play(ctx: RankContext, role: BuiltinWorker | ParameterServerShard) -> dict:
    """Train or serve, sampling the rank's resources where the run records them; then, once
    the survivors agree on who was lost (if anyone may be), this rank's report."""
    if not ctx.config.instrumentation:
        return _play(ctx, role)
    with ResourceSampler(ctx.rank, ctx.topology.role(ctx.rank), ctx.now,
                         ctx.transport.counters.moved) as sampler:
        report = _play(ctx, role)
    report["resources"] = sampler.samples
    return report


def _play(ctx: RankContext, role: BuiltinWorker | ParameterServerShard) -> dict:
    role.run()
    seen = set(role.lost) if isinstance(role, ParameterServerShard) else set()
    return role.report(agree_on_lost(ctx, seen))


@dataclass(frozen=True)
class BuiltinEnding:
    """How polyrhythm train's job ends (launch/rank/life.py's finish): rank 0 evaluates the
    final model on the validation set (`val`, the worker's; None on a server, which reads it
    only now) and records the data plan and how the shards were read. Its workers leave as
    the run ends: nobody else needs the final model."""

    plan: DataPlan
    val: Dataset | None = None
    shares_final = False  # the workers do not take the final model
    scripted = False  # polyrhythm train's job, resumed by polyrhythm train

    def result(self, ctx: RankContext, reports: list[dict], flat: torch.Tensor,
               figures: dict | None) -> RunResult:
        config = ctx.config
        val = self.val or load_val(open_source(config.data, config.seed), self.plan)
        result = summarise(config, reports, flat, val, ctx.now())
        result.summary["data"] = self.plan.summary() | shards_read(reports)
        # When training ran, by the wall clock: what an emulated cluster's fidelity guard
        # judges.
        result.summary["training_window"] = [ctx.clock_began, time.time()]
        return result


def shards_read(reports: list[dict]) -> dict:
    """How the workers read their shards, all at once as the run starts: the rows, the
    slowest worker's seconds, and the rows per second that makes."""
    seconds = max(r["read_s"] for r in reports if "read_s" in r)
    rows = sum(r["shard_rows"] for r in reports if "shard_rows" in r)
    return {"read_rows": rows, "read_s": seconds,
            "read_examples_per_s": rows / seconds if seconds > 0 else None}
