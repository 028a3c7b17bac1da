"""A user's script joining its job: `polyrhythm.init()`.

Started by `polyrhythm run` (launch/launchers/script_launcher.py) or by torchrun on real
nodes, every process of the job runs the script. `init()` reads the job from the environment
(the rank as torchrun gives it; the run's config from POLYRHYTHM_CONFIG, or
POLYRHYTHM_STRATEGY and POLYRHYTHM_SERVERS with every other setting at its default), joins
the process group and takes the role its rank has: a worker gets its Job (runtime/worker/script.py)
and the script goes on; a server never returns to the script: it waits for worker 0 to say
what it serves (the flat model and the script's optimizer, at the first step), serves, hands
in its report and ends the process. Started without a launcher (`python script.py`), the
script is one worker with nothing to exchange and nothing recorded: it runs as it would
without polyrhythm.

Rank 0 records the run (under the config's `out`, or completes POLYRHYTHM_RUN_ID there) as
`polyrhythm train` does: the store, `report` and `compare` read it alike. A resumed run's
ranks (`polyrhythm run --resume`) find the checkpoint to go on from in POLYRHYTHM_RESUME: a
server loads its slices there (re-sliced if the servers changed), a worker its state when the
script's `job.epochs(n)` begins (runtime/worker/script.py).
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch

from polyrhythm.comm import group
from polyrhythm.config import COMPONENTS, RunConfig, given_to_a_script, load_config
from polyrhythm.context import ProgressSink, RankContext, Topology, no_progress
from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.launch.process.failures import (
    RankFailure,
    mark_joined,
    mark_training,
    rank_ended,
)
from polyrhythm.launch.rank.life import enter, finish, leave_now, live
from polyrhythm.launch.rank.rendezvous import join_group
from polyrhythm.launch.rank.torchrun import env_int, job_rank, job_record, shared_run_dir
from polyrhythm.metrics.records import RunRecord
from polyrhythm.runtime.checkpoint import Resume
from polyrhythm.runtime.job import Served, serve
from polyrhythm.runtime.summary import RunResult, combine
from polyrhythm.runtime.survivors import agree_on_lost
from polyrhythm.runtime.worker.script import Job
from polyrhythm.strategies import STRATEGIES

ENV_CONFIG, ENV_RUN_ID = "POLYRHYTHM_CONFIG", "POLYRHYTHM_RUN_ID"
ENV_RENDEZVOUS = "POLYRHYTHM_RENDEZVOUS"  # a file store (polyrhythm run); else env:// (torchrun)
# A resumed run's checkpoint folder, and how many servers wrote it (the model is re-sliced
# where the run now has another number).
ENV_RESUME, ENV_RESUME_SERVERS = "POLYRHYTHM_RESUME", "POLYRHYTHM_RESUME_SERVERS"
# The settings polyrhythm run's user set that only some scripts read (config
# given_to_a_script), comma-separated: the config file the ranks read holds every setting.
ENV_GIVEN = "POLYRHYTHM_GIVEN"
_JOINED: list = []
# The script's exit status, where its launcher knows it before the exit handlers run (a rank
# of polyrhythm run: launch/rank/preloaded.py): a job left unfinished is finished only after 0.
EXIT_STATUS: list[int] = []


def joined() -> bool:
    """Whether this process has joined its job (polyrhythm.init())."""
    return bool(_JOINED)


def init() -> Job:
    """Join the job this process is part of (module docstring); a worker's Job."""
    if _JOINED:
        raise ConfigError("polyrhythm.init() was called twice: call it once, first")
    if "RANK" not in os.environ:
        _JOINED.append(None)
        return Job(None)
    config = job_config()
    rank, world = job_rank(config, START), _env_int("WORLD_SIZE")
    if world != config.world_size:
        raise ConfigError(f"the launcher started {world} processes but the run needs "
                          f"{config.world_size} ({config.servers} servers + {config.workers} "
                          "workers)")
    # job_record holds the run until this process ends: a resume waits for it (runlock.py).
    record, run_dir = job_record(config, rank, os.environ.get(ENV_RUN_ID), script=sys.argv[0])
    if run_dir is not None:
        mark_joined(run_dir, rank)
    rendezvous = os.environ.get(ENV_RENDEZVOUS)
    # Under polyrhythm run (its file store) the launcher, which sees every rank end, records
    # a failure: rank 0 may only have lost a peer that explains it (a server, when a worker
    # dies). Under torchrun, rank 0 records it.
    sys.excepthook = _failing(rank, config, None if rendezvous else record, run_dir)
    if rendezvous:
        group.join(rank, world, config.timeout,
                   store=group.file_store(rendezvous, world, config.timeout))
    else:
        join_group(rank, world, timedelta(seconds=config.timeout))
    if os.environ.get(ENV_RUN_ID) is None:  # rank 0 made the run: all learn where it is
        run_dir = shared_run_dir(config, record)
        sys.excepthook = _failing(rank, config, None if rendezvous else record, run_dir)
    ctx = enter(config, rank, lambda: None, _marking_training(run_dir), run_dir,
                _resume_point())
    _JOINED.append(ctx)
    if ctx.topology.role(rank) == "server":
        torch.set_num_threads(1)  # servers mostly wait
        # What it serves, the first worker tells it at its first step (_describe).
        served = ctx.transport.broadcast_object(None, src=ctx.topology.worker_ranks[0])
        live(ctx, serve(ctx, served), record, SCRIPT_ENDING)
        leave_now(0, ctx)
    job = Job(ctx, describe_servers=_describe if ctx.topology.servers else None,
              finish=lambda job: _finish_worker(job, record), given=_given(config))
    atexit.register(_finish_at_exit, job)
    return job


def _finish_at_exit(job: Job) -> None:
    """A script that trained and ended without job.finish() (and without an error: that
    ends the process through its excepthook) is finished as it exits, with a notice."""
    if job.finished or job.strategy is None or (EXIT_STATUS and EXIT_STATUS[-1] != 0):
        return
    print(f"polyrhythm: worker {job.worker}'s script ended without job.finish(): finished "
          "it as the script exits (call job.finish() after training)", file=sys.stderr)
    job.finish()
    leave_now(0, job.ctx)  # the exit handlers running now would not run the one finish adds


def job_config() -> RunConfig:
    """The run's config: POLYRHYTHM_CONFIG's file, else the strategy and servers the
    environment names, with as many workers as the launcher started beside the servers."""
    path = os.environ.get(ENV_CONFIG)
    if path:
        return load_config(path)
    # polyrhythm run's defaults: its strategy, and one server where it has servers.
    strategy = os.environ.get("POLYRHYTHM_STRATEGY") or COMPONENTS["strategy"].default
    named = os.environ.get("POLYRHYTHM_SERVERS", "")
    if not named:
        spec = STRATEGIES.get(strategy)
        named = "1" if spec is not None and spec.uses_servers else "0"
    if not named.isdigit():
        raise ConfigError(f"POLYRHYTHM_SERVERS={named!r}: give a number of servers")
    servers = int(named)
    return RunConfig(strategy=strategy, servers=servers,
                     workers=_env_int("WORLD_SIZE") - servers)


def _given(config: RunConfig) -> frozenset[str] | None:
    """The settings the run was given that only some scripts read (polyrhythm run's, or
    those of torchrun's config file); None where unknown: a resumed run, checked when it
    first started."""
    if ENV_GIVEN in os.environ:
        return frozenset(filter(None, os.environ[ENV_GIVEN].split(",")))
    return None if os.environ.get(ENV_RESUME) else given_to_a_script(config)


def _resume_point() -> Resume | None:
    """The checkpoint a resumed run goes on from (None: a run from the start)."""
    folder = os.environ.get(ENV_RESUME)
    return Resume(Path(folder), _env_int(ENV_RESUME_SERVERS)) if folder else None


def _marking_training(run_dir: Path | None) -> ProgressSink:
    """A worker's progress sink: its first step's event marks that training has begun, for
    the launcher (launch/process/failures.py's mark_training); the rest are dropped (a script's run
    draws no progress board)."""
    if run_dir is None:
        return no_progress
    marked: list[bool] = []

    def mark(event: dict) -> None:
        if not marked:
            mark_training(run_dir)
            marked.append(True)
    return mark


START = "start the script with polyrhythm run or torchrun"


def _env_int(name: str) -> int:
    return env_int(name, START)


def _failing(rank: int, config, record: RunRecord | None, run_dir: Path | None):
    """An excepthook: the error in one line with the script's line it came from, for the
    launcher (a report in the run's logs) and the record (rank 0's, where it is given), then
    the traceback, and the process ends."""
    def hook(kind, exc, trace) -> None:
        failure = RankFailure.of(rank, exc)
        script = os.path.abspath(sys.argv[0])
        lines = [f for f in traceback.extract_tb(trace) if os.path.abspath(f.filename) == script]
        if lines:
            failure = RankFailure(rank, failure.kind,
                                  f"{failure.error} ({Path(script).name}, line "
                                  f"{lines[-1].lineno})")
        rank_ended(rank, failure, failure.error, Topology(config.servers, config.workers), run_dir,
                   record)
        # To the process's own stderr: torch's process group wraps this hook in one that
        # holds what it prints in a buffer until it returns, which it never does. A misuse
        # polyrhythm names (a PolyrhythmError) is its one line, which polyrhythm run's
        # launcher (it names the run) says itself; a bug, its traceback.
        if isinstance(exc, PolyrhythmError):
            if os.environ.get(ENV_RUN_ID) is None:
                print(f"polyrhythm: error: {failure.error}", file=sys.__stderr__)
        else:
            traceback.print_exception(kind, exc, trace, file=sys.__stderr__)
        # Out now: tearing down a process group whose peers are failing too can abort
        # (SIGABRT), which would read as a crash rather than the error reported.
        leave_now(1)
    return hook


def _describe(job: Job) -> None:
    """Worker side of what the servers serve (every worker calls it at its first step)."""
    ctx = job.ctx
    ctx.transport.broadcast_object(
        Served(job.flat.data.clone(), job.flat.shapes, job.steps_per_epoch, job.total_epochs,
               job.servers_spec), src=ctx.topology.worker_ranks[0])


def _finish_worker(job: Job, record: RunRecord | None) -> None:
    """`job.finish()`, once this worker has left its servers or peers: agree on the final
    model's buffers, hand in the report, take the final model, and leave the job."""
    lost = agree_on_lost(job.ctx, set())
    job.agree_on_statistics()
    _finish(job.ctx, job.report(lost), record, job)


def _finish(ctx: RankContext, report: dict, record: RunRecord | None, job: Job) -> None:
    """Finish the job as every rank does (life.py's finish): each worker takes the final
    model, and the first worker left runs the script's evaluation of it; rank 0 records the
    run."""
    finish(ctx, report, record, SCRIPT_ENDING, job)
    # The rest of the script runs on; when it ends, the process leaves without C++'s static
    # destructors, which abort now and then ("terminate called without an active
    # exception", SIGABRT) while Gloo's threads wind down: a completed run would read as a
    # crash. Handlers registered before this one are skipped: stdio is flushed here.
    atexit.register(leave_now, 0, ctx)


class ScriptEnding:
    """How a script's job ends (life.py's finish): every worker takes the final model
    (the script goes on with it: job.save, its own evaluation), and rank 0 records it with
    the script's evaluation of it as the final figures."""

    shares_final = True
    scripted = True

    def result(self, ctx: RankContext, reports: list[dict], flat: torch.Tensor,
               figures: dict[str, float] | None) -> RunResult:
        """The run's result: the final model (the first worker's state, its buffers the
        workers' mean, its trained parameters `flat`, ties kept: tied entries are one
        tensor), and the script's evaluation of that model as its final figures (`figures`;
        None: not evaluated, and the final figures unknown)."""
        return _result(ctx, reports, flat, figures)


SCRIPT_ENDING = ScriptEnding()


def _result(ctx: RankContext, reports: list[dict], flat: torch.Tensor,
            figures: dict[str, float] | None) -> RunResult:
    first = next(r for r in reports if "model" in r)
    state = first["model"]
    shapes = first["shapes"]
    bounds = [0]
    for shape in shapes:
        bounds.append(bounds[-1] + math.prod(shape))
    pieces: dict[int, torch.Tensor] = {}
    for name, i in first["aliases"].items():
        if name in state:
            if i not in pieces:
                pieces[i] = flat[bounds[i]:bounds[i + 1]].view(shapes[i]).clone()
            state[name] = pieces[i]
    figures = figures or {}
    final = {k: figures[k] for k in ("val_loss", "val_accuracy") if k in figures}
    logged_accuracy = "val_accuracy" in figures or any("val_accuracy" in e
                                                         for e in first["epochs"])
    result = combine(ctx.config, reports, state, final, len(flat), ctx.now(), logged_accuracy)
    summary = result.summary
    summary["script"] = os.path.abspath(sys.argv[0])
    summary["epochs"] = len(first["epochs"])  # the script's, whatever the config says
    # final_val_* are the script's evaluation of model.pt, or unknown; what worker 0 logged
    # last (of its own model, which may not be the final one) is kept apart, named so.
    summary["final_evaluated"] = bool(figures)
    if figures:
        summary["final_figures"] = figures
    last = first["epochs"][-1] if first["epochs"] else {}
    logged = {k: last[k] for k in ("val_loss", "val_accuracy") if k in last}
    if logged:
        summary["last_logged"] = {**logged, "worker": first["worker"]}
    # The global batch is the workers' loaders', not the config's (the simulator's
    # calibration sizes a run's steps by it), and each worker's, by worker index (None: a
    # worker lost, whose report went with it).
    batches = {ctx.topology.worker_index(r["rank"]): r["batch_size"] for r in reports
               if "batch_size" in r}
    summary["batch_size"] = sum(batches.values())
    summary["worker_batch_size"] = [batches.get(w) for w in range(ctx.config.workers)]
    # From the clock's start (the workers' first step) until now, in the machine's time: the
    # window an emulated cluster's fidelity guard judges, as for polyrhythm train's job.
    summary["training_window"] = [ctx.clock_began, time.time()]
    return result
