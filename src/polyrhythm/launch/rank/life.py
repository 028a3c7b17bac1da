"""The life of one rank, whoever started it (the local launcher or torchrun): join the job's
process group, open the transport, play the role the topology gives this rank, record the
run on rank 0, leave together, and end the process (`leave_now`: the one way every rank's
process ends, a script's too).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from polyrhythm.comm import group
from polyrhythm.comm.transport import Transport
from polyrhythm.context import ProgressSink, RankContext, Topology, no_progress
from polyrhythm.files import atomic_file
from polyrhythm.launch.process.failures import mark_left
from polyrhythm.metrics.records import RunRecord, complete_run
from polyrhythm.runtime.checkpoint import Resume, tidy
from polyrhythm.runtime.job import run_rank
from polyrhythm.units import Delay, duration

JoinGroup = Callable[[], None]  # initialises the default process group (Gloo)


def latency(config, rank: int) -> Callable[[], float] | None:
    """This rank's draw of the extra one-way latency of a message, if the run adds any
    (seeded by the run's seed and the rank, so a run's delays repeat)."""
    mean = duration(config.cluster.latency, "latency")
    jitter = duration(config.cluster.latency_jitter, "latency_jitter")
    if not (mean or jitter):
        return None
    return Delay(mean, jitter).sampler(config.seed * 100_003 + rank)


def lifecycle(config, rank: int, join: JoinGroup, record: RunRecord | None,
              progress: ProgressSink = no_progress, local_workers: int | None = None,
              run_dir: Path | None = None, resume: Resume | None = None) -> dict | None:
    """Run this rank of the job; rank 0 completes the run's record (given as `record`) and
    returns the summary. Every rank writes its checkpoints under `run_dir` (None: none) and,
    resuming, starts from `resume`; once all are done, rank 0 leaves only the last two.
    Raises whatever ended the rank early."""
    join()
    topology = Topology(config.servers, config.workers)
    transport = Transport()
    transport.open(rank, topology.world_size, topology.worker_ranks, latency(config, rank),
                   config.timeout)
    ctx = RankContext(config, rank, topology, transport, progress=progress, run_dir=run_dir,
                      resume=resume)
    return leave_together(ctx, run_rank(ctx, local_workers), record)


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
