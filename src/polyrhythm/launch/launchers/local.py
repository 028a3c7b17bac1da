"""The local launcher: starts every rank on loopback, supervises them, tears them all down.

Ranks are forked from a multiprocessing forkserver that has imported torch and the runtime
once, so a rank starts in milliseconds rather than importing torch (3 s of CPU each, all
ranks at once on the same cores); the forkserver stays up for the launcher's later runs. It
forks from a process that has run no torch operation, so no OpenMP pool or Gloo state is
copied.

The ranks meet through a file store in the run's folder: no port race, and nothing listens
beyond loopback (Gloo binds 127.0.0.1; a TCP store would listen on every interface). Any rank
failing, Ctrl-C or SIGTERM ends every process; ranks also leave the moment the launcher is
gone (they watch a pipe only the launcher holds), and then the forkserver exits too, so no
process outlives the run.
"""

from __future__ import annotations

import signal
import time
from multiprocessing.connection import wait

from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import Topology
from polyrhythm.errors import RunFailed
from polyrhythm.launch.launchers.progress import ProgressBoard
from polyrhythm.launch.process import forkserver
from polyrhythm.launch.process.events import RankEvents
from polyrhythm.launch.process.failures import (
    Kind,
    RankFailure,
    cause,
    completed_summary,
    goes_on_without,
    going_on_without,
    how,
    left_behind,
    lost_a_peer,
    rank_failed,
    recorded_failure,
)
from polyrhythm.launch.process.signals import GRACE_S, raise_interrupt, signal_handlers
from polyrhythm.launch.rank.forked import process_name, rank_main
from polyrhythm.metrics.records import RunRecord, read_summary
from polyrhythm.runtime.checkpoint import Resume, tidy

RENDEZVOUS_FILE = "rendezvous"


def launch_local(config, record: RunRecord, progress: ProgressBoard | None = None,
                 resume: Resume | None = None) -> dict:
    """Run the job in local processes; return the summary or raise RunFailed.

    Whatever ends the run early (a rank failing, Ctrl-C, SIGTERM, an error here) stops every
    process and stores the run as failed with a one-line reason (a bug's traceback is in the
    log it names).
    """
    topology = Topology(config.servers, config.workers)
    board = progress or ProgressBoard(config.workers, enabled=False)
    procs: list = []
    pipe: tuple = ()
    events: RankEvents | None = None
    try:
        with signal_handlers(sigterm=raise_interrupt):
            rendezvous = record.dir / RENDEZVOUS_FILE
            rendezvous.unlink(missing_ok=True)  # a resumed run's old one
            ctx = forkserver.context()
            events = RankEvents(ctx, topology.world_size)  # a pipe each (launch/process/events.py)
            # Nobody writes into `alive`: a rank that reads end-of-file knows its launcher is
            # gone.
            alive, alive_w = pipe = ctx.Pipe(duplex=False)
            procs = [ctx.Process(target=rank_main, name=process_name(rank),
                                 args=(config.to_dict(), rank, str(rendezvous), record,
                                       events.senders[rank], alive, resume))
                     for rank in range(topology.world_size)]
            with forkserver.child_environment():
                events.start(procs)
            _supervise(procs, events, board, topology, record,
                       carry_on=config.on_worker_failure == CONTINUE)
        return read_summary(record)
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary  # a rank lost once the run was recorded, as the job left
        # Said in one line; a bug of the launcher's own keeps its traceback in the run's logs.
        raise recorded_failure(record, exc, config) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):  # teardown must finish
            _teardown(procs)
            for end in pipe:
                end.close()
            if events is not None:
                events.close()
            (record.dir / RENDEZVOUS_FILE).unlink(missing_ok=True)
            # No rank writes any more: a failed run keeps the last two complete checkpoints,
            # to resume from (a completed one has been tidied by its rank 0 already).
            tidy(record.dir, config.workers, config.servers, completed=False)


def _supervise(procs: list, events: RankEvents, board: ProgressBoard, topology: Topology,
               record: RunRecord, carry_on: bool = False) -> None:
    """Wait for every rank; raise RunFailed when one fails, unless it is a worker lost during
    training that the run may `carry_on` without (on_worker_failure = continue: its servers
    go on; failures.py's goes_on_without). Training has begun once a worker reports
    progress: every rank is then past the start, where each waits for all."""
    failures: dict[int, RankFailure] = {}
    lost: set[int] = set()
    training = False
    running = {p.sentinel: rank for rank, p in enumerate(procs)}
    while running:
        ready = wait(list(running), timeout=0.2)
        training |= _drain(events, board, failures)
        board.draw()
        ended = [running.pop(s) for s in ready]
        for r in ended:
            procs[r].join()  # sets exitcode
        if carry_on and procs[0].exitcode == 0:  # the run is recorded: nobody waits for
            _end_left_behind(procs, record, lost)  # a worker it went on without
        failed = [r for r in ended if procs[r].exitcode != 0 and r not in lost]
        if failed and carry_on and training and goes_on_without(
                failed, lambda r: procs[r].exitcode, failures, topology, lost):
            for r in failed:
                lost.add(r)
                board.lines[topology.worker_index(r)] = going_on_without(
                    procs[r].exitcode, failures.get(r), record.log_path(r))
            continue
        if failed:
            failed = _with_the_cause(failed, procs, events, board, failures, lost)
            raise _failure(failed, procs, failures, topology, record)
    _drain(events, board, failures)
    board.draw(force=True)


def _with_the_cause(failed: list[int], procs: list, events: RankEvents, board: ProgressBoard,
                    failures: dict[int, RankFailure], lost: set[int]) -> list[int]:
    """The ranks that failed, with those that ended meanwhile (a dead server explains its
    workers' errors). While each of them only lost a peer, the others get GRACE_S to show
    the failure that explains it: a process killed is seen ended only once the forkserver
    has reaped it, which on a loaded machine came after the server, which saw its
    connection break, had failed and been reaped (the server was named for the worker
    killed under it)."""
    deadline = time.monotonic() + GRACE_S
    while True:
        _drain(events, board, failures)
        failed = failed + [r for r, p in enumerate(procs) if r not in failed and r not in lost
                           and not p.is_alive() and p.exitcode]
        running = [p.sentinel for r, p in enumerate(procs) if r not in lost and p.is_alive()]
        if (not running or time.monotonic() > deadline
                or not all(lost_a_peer(failures.get(r)) for r in failed)):
            return failed
        wait(running, timeout=0.1)


def _end_left_behind(procs: list, record: RunRecord, lost: set[int]) -> None:
    """End the workers the completed run went on without that still run (frozen, or cut
    off), as lost (one that has ended is seen as any other)."""
    for r in left_behind(record) - lost:
        if procs[r].is_alive():
            lost.add(r)
            procs[r].kill()


def _drain(events: RankEvents, board: ProgressBoard,
           failures: dict[int, RankFailure]) -> bool:
    """Take the ranks' events: failures, and progress for the board; whether any was
    progress."""
    progress = False
    for event in events.take():
        if "failure" in event:
            failure = RankFailure.from_dict(event["failure"])
            failures[failure.rank] = failure
        else:
            board.update(event)
            progress = True
    return progress


def _failure(failed: list[int], procs: list, failures: dict[int, RankFailure],
             topology: Topology, record: RunRecord) -> RunFailed:
    """What ended the run, from the rank that explains the others' failures."""
    first = cause(failed, {r: procs[r].exitcode for r in failed}, failures)
    failure, code, log = failures.get(first), procs[first].exitcode, record.log_path(first)
    if failure is not None and failure.kind == Kind.SILENT and code >= 0:
        return RunFailed(_silent_peers(procs, topology, how(code, failure, log)))
    return rank_failed(first, code, failure, log, topology)


def _silent_peers(procs: list, topology: Topology, how: str) -> str:
    """A wait timed out: name the ranks that stopped (SIGSTOP, a debugger) or hang."""
    stopped = [r for r, p in enumerate(procs) if p.is_alive() and _state(p.pid) in ("T", "t")]
    if stopped:
        names = ", ".join(f"rank {r} ({topology.describe(r)})" for r in stopped)
        return (f"{names} stopped answering: no message from it within the timeout "
                "(--timeout)")
    return f"a peer stopped answering within the timeout (--timeout): {how}"


def _state(pid: int) -> str:
    """A process's state letter from /proc (R, S, T stopped, ...); '' if unreadable."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _teardown(procs: list) -> None:
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    for p in alive:
        p.join(GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


