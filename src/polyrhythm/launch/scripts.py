"""`polyrhythm run`: a user's script as a job on this machine. Every rank is the script in a
process of its own (`python script.py args`), told its rank, the run's config and record, and
a file to meet the others at (launch/script.py reads them); worker 0's output is shown, every
rank's is kept in the run's logs. A rank that fails ends the run: every other process is
stopped, and the run is recorded as failed with the failing rank, its error and the script's
line (the rank's own report). Ctrl-C and SIGTERM do the same. No process outlives the run:
each dies with its launcher too (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from polyrhythm.context import Topology
from polyrhythm.errors import RunFailed
from polyrhythm.launch.failures import (
    Kind,
    RankFailure,
    cause,
    rank_failed,
    read_reports,
    recorded_failure,
)
from polyrhythm.launch.local import (
    CHILD_ENVIRONMENT,
    GRACE_S,
    PR_SET_PDEATHSIG,
    raise_interrupt,
    signal_handlers,
)
from polyrhythm.launch.script import ENV_CONFIG, ENV_RENDEZVOUS, ENV_RUN_ID
from polyrhythm.metrics.records import RunRecord, read_summary


def launch_script(config, record: RunRecord, script: str, args: list[str],
                  show=sys.stdout) -> dict:
    """Run `script` as every rank of the job; the run's summary, or RunFailed."""
    topology = Topology(config.servers, config.workers)
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    rendezvous = record.dir / "rendezvous"
    try:
        with signal_handlers(sigterm=raise_interrupt):
            rendezvous.unlink(missing_ok=True)
            (record.dir / "logs").mkdir(exist_ok=True)
            for rank in range(topology.world_size):
                env = _environment(config, topology, record, rank, rendezvous)
                procs.append(subprocess.Popen(
                    [sys.executable, script, *args], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_launcher))
            first_worker = topology.worker_ranks[0]
            for rank, proc in enumerate(procs):
                readers.append(_copy_output(proc, record.log_path(rank),
                                            show if rank == first_worker else None))
            _supervise(procs, topology, record)
        for reader in readers:
            reader.join()
        return read_summary(record)
    except BaseException as exc:
        raise recorded_failure(record, exc, config) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            _stop(procs)
            rendezvous.unlink(missing_ok=True)


def _environment(config, topology: Topology, record: RunRecord, rank: int,
                 rendezvous: Path) -> dict[str, str]:
    threads = 1 if topology.role(rank) == "server" else (
        config.threads or max(1, (os.cpu_count() or 1) // topology.workers))
    return {**CHILD_ENVIRONMENT, **os.environ,  # a value the user set is kept
            "RANK": str(rank), "WORLD_SIZE": str(topology.world_size),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(topology.world_size),
            "OMP_NUM_THREADS": str(threads), ENV_CONFIG: str(record.dir / "config.toml"),
            ENV_RUN_ID: record.run_id, ENV_RENDEZVOUS: str(rendezvous),
            "PYTHONUNBUFFERED": "1"}


def _die_with_launcher() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _copy_output(proc: subprocess.Popen, log: Path, show) -> threading.Thread:
    """Copy a rank's output into its log (and onto `show`) as it comes."""
    def copy() -> None:
        with open(log, "ab") as file:
            for line in proc.stdout:
                file.write(line)
                file.flush()
                if show is not None:
                    show.write(line.decode(errors="replace"))
                    show.flush()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _supervise(procs: list[subprocess.Popen], topology: Topology, record: RunRecord) -> None:
    """Wait for every rank; the first to fail ends the run (RunFailed naming it)."""
    running = set(range(len(procs)))
    while running:
        for rank in sorted(running):
            code = procs[rank].poll()
            if code is None:
                continue
            running.discard(rank)
            if code != 0:
                raise _failure(procs, rank, topology, record)
        if running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[min(running)].wait(timeout=0.1)


def _failure(procs: list[subprocess.Popen], rank: int, topology: Topology,
             record: RunRecord) -> RunFailed:
    """The rank that explains the run's end, among those that ended by themselves (not
    stopped here) or reported an error: launch/failures.py's `cause`."""
    if _lost_a_peer(read_reports(record.dir).get(rank)):
        _await_another_failure(procs, record)
    codes = {r: p.returncode for r, p in enumerate(procs)
             if p.poll() is not None and p.returncode != 0}
    _stop(procs)
    reports = read_reports(record.dir)
    first = cause(sorted(set(codes) | set(reports)), codes, reports)
    return rank_failed(first, codes.get(first), reports.get(first), record.log_path(first),
                       topology)


def _lost_a_peer(failure: RankFailure | None) -> bool:
    """Whether a rank failed only because a peer's connection broke or fell silent: that
    peer explains it."""
    return failure is not None and failure.kind in (Kind.LOST, Kind.SILENT)


def _await_another_failure(procs: list[subprocess.Popen], record: RunRecord) -> None:
    """Give the ranks GRACE_S for one to end with an error of its own, not a lost peer (a
    script that fails on a worker can take longer to end than its peers take to see its
    connection go), so the cause is read from the rank that failed, not from its peers."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        reports = read_reports(record.dir)
        if any(p.poll() not in (None, 0) and not _lost_a_peer(reports.get(r))
               for r, p in enumerate(procs)):
            return
        running = [p for p in procs if p.poll() is None]
        if not running:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=0.1)  # the others are looked at again every 0.1 s


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank still running, SIGKILL those left after the grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
