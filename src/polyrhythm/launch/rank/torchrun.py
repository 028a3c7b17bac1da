"""Ranks started by torchrun and other launchers of torchrun-style ranks (polyrhythm.node):

    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-endpoint HOST:PORT -m polyrhythm.node run.toml

Every rank reads the same config and takes its role from its rank (servers first, then
workers). Rank 0 creates the run record under the config's `out` directory on its host as it
starts (before the rendezvous, so a job that never gathers is recorded as failed too), or
completes the one named by --run-id (the emulated cluster's launcher makes it).

    torchrun ... -m polyrhythm.node runs/RUN_ID/config.toml --resume RUN_ID

carries a failed run on from its newest usable checkpoint, in its record (rank 0 reopens it,
unless a launcher that names it with --run-id did): every rank reads the checkpoint from the
run's folder, which must be the same folder on every node (a shared disk), as the ranks
wrote their checkpoints there.

With POLYRHYTHM_SECRET_FILE naming a file of the run's secret (the same on every host), the
ranks meet through rank 0's gate, which admits only those that prove it (launch/rank/rendezvous.py);
without it, through torchrun's own store, which admits anyone.

With `hosts` set in the config, torchrun's node n runs the job ranks the placement gives host
n (config/emulation.py: host_ranks), whatever ranks torchrun numbered its processes with: so
`placement = "collocated"` puts a server beside the workers of every node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from polyrhythm.config import load_config
from polyrhythm.config.emulation import host_ranks
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.launch.process import runlock
from polyrhythm.launch.process.failures import (
    Kind,
    RankFailure,
    kind_of,
    mark_left,
    mark_training,
    one_line,
    rank_ended,
)
from polyrhythm.launch.process.signals import raise_interrupt
from polyrhythm.launch.rank.life import lifecycle
from polyrhythm.launch.rank.rendezvous import join_group
from polyrhythm.metrics.records import (
    RunRecord,
    check_resumable,
    reopen_run,
    start_run,
    summary_json_line,
)
from polyrhythm.runtime.checkpoint import Resume
from polyrhythm.runtime.intact import latest

START = "start this module with torchrun"


def env_int(name: str, start: str = START) -> int:
    """A torchrun variable of this process's environment; one line if it is not set."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise ConfigError(f"{name} is not set: {start}") from None


def job_record(config, rank: int, run_id: str | None,
               script: str | None = None) -> tuple[RunRecord | None, Path | None]:
    """(the run record rank 0 completes: a new one, or `run_id`'s made by a launcher; the
    run's folder, where every rank writes its checkpoints and failure report, None where no
    launcher named the run on a rank other than 0). `script`: a user's, the job's ranks."""
    record = None
    if rank == 0:
        record = (RunRecord(Path(config.out), run_id) if run_id
                  else start_run(config, script=script))
    run_dir = record.dir if record else (Path(config.out) / run_id if run_id else None)
    if run_dir is not None:
        with contextlib.suppress(OSError):  # not here: a node without the run's disk
            runlock.hold(run_dir)  # a resume waits for this process to leave
    return record, run_dir


def shared_run_dir(config, record: RunRecord | None) -> Path:
    """The folder of the run rank 0 made, told every rank once the group is up: each writes
    its checkpoints and failure report there (on a disk the nodes share, one folder; else
    each node's own), holding the run while it lives."""
    shared = [record.run_id if record is not None else None]
    dist.broadcast_object_list(shared, src=0)
    run_dir = Path(config.out) / shared[0]
    with contextlib.suppress(OSError):
        run_dir.mkdir(parents=True, exist_ok=True)
        runlock.hold(run_dir)
    return run_dir


def agreed_resume(config, rank: int, record: RunRecord | None, run_dir: Path,
                  reopen: bool) -> Resume:
    """Once the group is up: rank 0 reopens the failed run's record (`reopen`: no launcher
    did) and picks its newest usable checkpoint, and every rank learns it, or the one line
    why the run cannot go on (each raises it: none is left waiting for the others)."""
    said: list = [None, None]  # the checkpoint's folder, or the error
    if rank == 0:
        try:
            if reopen:
                check_resumable(record)
            stored = load_config(run_dir / "config.toml")
            point, done = latest(run_dir, stored.workers, stored.servers,
                                 say=lambda line: print(f"polyrhythm: {line}", file=sys.stderr))
            if reopen:
                reopen_run(record)
                print(f"polyrhythm: resuming run {run_dir.name} after epoch {done} of "
                      f"{config.epochs}", file=sys.stderr, flush=True)
            said[0] = str(point.folder)
        except PolyrhythmError as exc:
            said[1] = exc
    dist.broadcast_object_list(said, src=0)
    if said[1] is not None:
        raise said[1]
    return Resume.at(Path(said[0]))


def _progress(run_dir: Path | None):
    """A worker's progress sink: a line per epoch, and its first event marks that training
    has begun (for a launcher that may go on without a lost host: failures.py)."""
    marked: list[bool] = []

    def log(event: dict) -> None:
        if not marked and run_dir is not None:
            mark_training(run_dir)
            marked.append(True)
        if event["step"] == event["steps"]:  # one line per worker and epoch
            print(f"[worker {event['worker']}] epoch {event['epoch']}/{event['epochs']} "
                  f"loss {event['loss']:.4f} {event['samples_per_s']:.1f} samples/s",
                  file=sys.stderr, flush=True)
    return log


def host_of_this_rank(config, start: str = START) -> list[int]:
    """The job ranks on this rank's host; with `hosts` set, as the placement says. `start`:
    how to start the process, if torchrun's variables are missing."""
    local_rank, local_size = env_int("LOCAL_RANK", start), env_int("LOCAL_WORLD_SIZE", start)
    if not config.cluster.hosts:
        first = env_int("RANK", start) - local_rank
        return list(range(first, first + local_size))
    layout = host_ranks(config.cluster, config.servers, config.workers)
    nodes, node = env_int("GROUP_WORLD_SIZE", start), env_int("GROUP_RANK", start)
    if nodes != len(layout):
        raise ConfigError(f"torchrun started {nodes} nodes but the config places the job on "
                          f"{len(layout)} hosts")
    if local_size != len(layout[node]):
        raise ConfigError(f"torchrun started {local_size} processes on node {node} but the "
                          f"config places {len(layout[node])} there (--nproc-per-node)")
    return layout[node]


def job_rank(config, start: str = START) -> int:
    """This process's rank in the job: the launcher's RANK, or on an emulated cluster (`hosts`
    set) the rank the placement gives its host's LOCAL_RANK-th process (host_of_this_rank):
    torchrun numbers a node's processes in a row, the placement need not."""
    if not config.cluster.hosts:
        return env_int("RANK", start)
    return host_of_this_rank(config, start)[env_int("LOCAL_RANK", start)]


def run_node(config_path: str, run_id: str | None = None,
             resume: str | None = None) -> dict | None:
    """Run this rank of a torchrun job (going on with failed run `resume`, if given); job
    rank 0 returns the completed summary."""
    config = load_config(config_path)
    world = env_int("WORLD_SIZE")
    if world != config.world_size:
        raise ConfigError(f"torchrun started {world} processes but the config needs "
                          f"{config.world_size} ({config.servers} servers + {config.workers} "
                          "workers)")
    here = host_of_this_rank(config)
    rank = here[env_int("LOCAL_RANK")]
    record, run_dir = job_record(config, rank, run_id or resume)
    # torchrun stops the surviving ranks with SIGTERM when one fails: let rank 0 record it.
    signal.signal(signal.SIGTERM, raise_interrupt)
    # A launcher that named the run (--run-id) sees every host and records what ended it;
    # without one, rank 0 records its own end (resuming: once it has reopened the run).
    recording = record if run_id is None and resume is None else None
    point = None
    try:
        join_group(rank, world, timedelta(seconds=config.timeout))
        if resume is not None:
            point = agreed_resume(config, rank, record, run_dir, reopen=run_id is None)
            recording = record if run_id is None else None
        elif run_id is None:  # rank 0 made the run: every rank learns where it is
            run_dir = shared_run_dir(config, record)
        summary = lifecycle(config, rank, lambda: None, record, progress=_progress(run_dir),
                            local_workers=sum(r >= config.servers for r in here),
                            run_dir=run_dir, resume=point)
    except BaseException as exc:
        stopped = isinstance(exc, KeyboardInterrupt)
        failure = None if stopped else RankFailure.of(rank, exc)
        # A resume refused leaves no report: the run may be another launcher's, still going.
        refused = resume is not None and point is None and isinstance(exc, PolyrhythmError)
        rank_ended(rank, None if refused else failure,
                   "stopped by torchrun" if stopped else failure.error,
                   Topology(config.servers, config.workers), run_dir, recording)
        raise
    if run_dir is not None:
        mark_left(run_dir, rank)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyrhythm.node")
    parser.add_argument("config", help="run config (TOML), the same file on every host")
    parser.add_argument("--run-id", help="complete this run record (made by a launcher) "
                        "rather than a new one")
    parser.add_argument("--resume", metavar="RUN_ID", help="carry on this failed run (under "
                        "the config's out, on a disk every node shares) from its newest "
                        "usable checkpoint, in its record")
    args = parser.parse_args(argv)
    try:
        summary = run_node(args.config, args.run_id, args.resume)
    except PolyrhythmError as exc:
        print(f"polyrhythm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("polyrhythm: stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # a peer failed, or a bug: one line (torchrun reports it)
        bug = kind_of(exc) == Kind.BUG
        if bug:  # its traceback, in this rank's output (torchrun's, a host's log)
            traceback.print_exc()
        print(f"polyrhythm: error: {type(exc).__name__}: {one_line(exc)}"
              f"{' (a bug: traceback above)' if bug else ''}", file=sys.stderr)
        return 1
    if summary:
        print(summary_json_line(summary))
    return 0
