"""The life of one rank of a job, whoever started it (the local launcher, torchrun, Spark
through polyrhythm.node, a user's script through polyrhythm.init()): join the job's process
group and open the transport (`enter`); play the role the topology gives this rank (`live`:
a built role resumed, the clock started with every rank's, played to its report); finish
together (`finish`: rank 0 gathers the reports, makes the final model and records the run);
leave together, and end the process (`leave_now`: the one way every rank's process ends).

polyrhythm train's job is `lifecycle`. A script's ranks live the same life
(launch/rank/script_rank.py): a server is `live` as here, serving what the first worker
tells it; a worker's role is the script itself, on its Job, whose `job.finish()` is `finish`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from polyrhythm.comm import group
from polyrhythm.comm.transport import Transport
from polyrhythm.config.servers import goes_on_elastic
from polyrhythm.context import ProgressSink, RankContext, Topology, no_progress
from polyrhythm.errors import RunFailed
from polyrhythm.files import atomic_file
from polyrhythm.launch.process.failures import (
    lost_a_peer,
    mark_left,
    rank_failed,
    read_reports,
    recorded_failure,
)
from polyrhythm.metrics.records import RunRecord, complete_run
from polyrhythm.runtime.checkpoint import Resume, tidy
from polyrhythm.runtime.job import BuiltinEnding, agree_on_plan, build_role, play, set_threads
from polyrhythm.runtime.summary import RunResult, final_parameters
from polyrhythm.strategies import STRATEGIES
from polyrhythm.units import Delay, duration

JoinGroup = Callable[[], None]  # initialises the default process group (Gloo)


class Ending(Protocol):
    """How a job ends at `finish` (runtime/job.py BuiltinEnding, script_rank.py's
    ScriptEnding)."""

    shares_final: bool  # every worker takes the final model (a script goes on with it)
    scripted: bool  # a user's script's run (resumed by polyrhythm run)

    def result(self, ctx: RankContext, reports: list[dict], flat: torch.Tensor,
               figures: dict | None) -> RunResult:
        """On rank 0: the run's result from every rank's report, the final parameters and
        the figures the first worker's evaluation gave (None: none)."""


def latency(config, rank: int) -> Callable[[], float] | None:
    """This rank's draw of the extra one-way latency of a message, if the run adds any
    (seeded by the run's seed and the rank, so a run's delays repeat)."""
    mean = duration(config.cluster.latency, "latency")
    jitter = duration(config.cluster.latency_jitter, "latency_jitter")
    if not (mean or jitter):
        return None
    return Delay(mean, jitter).sampler(config.seed * 100_003 + rank)


def enter(config, rank: int, join: JoinGroup, progress: ProgressSink = no_progress,
          run_dir: Path | None = None, resume: Resume | None = None) -> RankContext:
    """Join the job (`join`: its process group) and open this rank's transport: the rank's
    context, which writes its checkpoints under `run_dir` (None: none) and, resuming, starts
    from `resume`."""
    join()
    topology = Topology(config.servers, config.workers)
    transport = Transport()
    elastic = goes_on_elastic(config, STRATEGIES[config.strategy.name])
    transport.open(rank, topology.world_size, topology.worker_ranks, latency(config, rank),
                   config.timeout, elastic=config.min_workers if elastic else None)
    return RankContext(config, rank, topology, transport, progress=progress, run_dir=run_dir,
                       resume=resume)


def lifecycle(config, rank: int, join: JoinGroup, record: RunRecord | None,
              progress: ProgressSink = no_progress, local_workers: int | None = None,
              run_dir: Path | None = None, resume: Resume | None = None) -> dict | None:
    """This rank's life in polyrhythm train's job; rank 0 completes the run's record (given
    as `record`) and returns the summary. Every rank writes its checkpoints under `run_dir`
    (None: none) and, resuming, starts from `resume`; once all are done, rank 0 leaves only
    the last two. Raises whatever ended the rank early."""
    ctx = enter(config, rank, join, progress, run_dir, resume)
    worker = ctx.topology.role(rank) == "worker"
    set_threads(config, "worker" if worker else "server", local_workers or config.workers,
                rank)
    began = time.perf_counter()
    plan, source = agree_on_plan(ctx)
    role = build_role(ctx, plan, source)  # before the clock starts: building is set-up
    if worker:  # opening the data and reading its shard
        role.read_s = time.perf_counter() - began
    return live(ctx, role, record, BuiltinEnding(plan, role.val if worker else None))


def live(ctx: RankContext, role, record: RunRecord | None, ending: Ending) -> dict | None:
    """Play `role` (a built worker or server shard) to its end: resumed from the run's
    checkpoint where it resumes, the clock started with every rank's, trained or served,
    and the job finished (rank 0's summary, others None). Every server's life, any job's."""
    if ctx.resume is not None:
        role.resume(ctx.resume)
    ctx.start_clock(role.resumed_s)
    return finish(ctx, play(ctx, role), record, ending)


def finish(ctx: RankContext, report: dict, record: RunRecord | None, ending: Ending,
           job=None) -> dict | None:
    """Every rank's end of the job, any job's: gather every rank's `report` to rank 0,
    which makes the final model's parameters. Where the ending shares it, every worker
    (`job`, its Job) takes them and the first worker left runs the script's evaluation of
    it. Rank 0 records the run (or the failure of a worker that failed on its own); all
    leave together. Rank 0 returns the completed summary."""
    reports = ctx.transport.gather_object(report, dst=0)
    flat = final_parameters(reports) if reports is not None else None
    figures = None
    if ending.shares_final:
        first_rank = None if reports is None else next(r for r in reports if "model" in r)["rank"]
        flat, first_rank = ctx.transport.broadcast_object((flat, first_rank), src=0)
        if job is not None:
            job.take_final(flat, first_rank)
            if ctx.rank == first_rank:
                figures = job.final_figures()
        figures = ctx.transport.broadcast_object(figures, src=first_rank)
    result = None
    if reports is not None and record is not None:
        failed = failed_on_its_own(ctx, reports, record)
        if failed is None:
            result = ending.result(ctx, reports, flat, figures)
        else:
            recorded_failure(record, failed, ctx.config, script=ending.scripted)
    return leave_together(ctx, result, record)


def failed_on_its_own(ctx: RankContext, reports: list[dict],
                      record: RunRecord) -> RunFailed | None:
    """The failure of a worker the servers went on without (on_worker_failure = continue)
    that was no loss: it failed on an error of its own, as its report in the run's logs says
    (written before its connection broke, so here by now). The run failed for it, whatever
    the others did; None if every worker gone was lost."""
    if ctx.run_dir is None:
        return None
    gone = sorted({entry["rank"] for r in reports for entry in r.get("lost", ())})
    failures = read_reports(ctx.run_dir) if gone else {}
    for rank in gone:
        if rank in failures and not lost_a_peer(failures[rank]):
            return rank_failed(rank, None, failures[rank], record.log_path(rank), ctx.topology)
    return None


def leave_together(ctx: RankContext, result, record: RunRecord | None) -> dict | None:
    """Rank 0 records the run's `result` (runtime/summary.py RunResult: its model and
    summary) in `record` and returns the summary; then every rank leaves the job together,
    rank 0 leaving only the last two checkpoints. A built-in job's ranks and a script's end
    here alike."""
    summary = None
    if result is not None and record is not None:
        with atomic_file(record.model_path) as file:  # a full disk leaves no half a model
            torch.save(result.state_dict, file)
        summary = complete_run(record, result.summary, result.epochs, result.series)
    ctx.transport.barrier()  # leave together: a rank tearing down Gloo early can abort its peers
    if ctx.rank == 0 and ctx.run_dir is not None:  # every rank is past its last checkpoint
        tidy(ctx.run_dir, ctx.config.workers, ctx.config.servers, completed=True)
    group.leave()
    return summary


def leave_now(code: int, ctx: RankContext | None = None, exit_handlers: bool = False) -> None:
    """End this rank's process now with `code`, its output flushed, without C++'s static
    destructors: they abort now and then ("terminate called without an active exception",
    SIGABRT) while Gloo's threads wind down, and a rank that said why it failed, or a run
    completed, would read as a crash. `ctx`: a rank of a job that has done its part leaves
    the mark that it has (failures.py's mark_left); `exit_handlers`: Python's exit handlers
    run first (those registered so far; a script's, torchrun's)."""
    if ctx is not None and ctx.run_dir is not None:
        mark_left(ctx.run_dir, ctx.rank)
    if exit_handlers:
        atexit._run_exitfuncs()
    flush_output()
    os._exit(code)


def flush_output() -> None:
    """Flush what this process printed (a stream closed, or whose reader is gone, is let
    be): before it ends without Python's own flushing."""
    for stream in (sys.stdout, sys.stderr, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
