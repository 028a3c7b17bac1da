"""A rank forked by the local launcher (launchers/local.py) from the forkserver: it dies with
its launcher, shows its rank's name, writes what it prints to its log, meets the others
through the run's file store and lives the built-in job's life (life.py), telling its
launcher a failure's kind through its events pipe (process/events.py).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading

from polyrhythm.comm import group
from polyrhythm.launch.process import runlock
from polyrhythm.launch.process.events import send
from polyrhythm.launch.process.failures import RankFailure
from polyrhythm.launch.process.prctl import set_process_name, signal_on_parent_death
from polyrhythm.launch.rank.life import leave_now, lifecycle
from polyrhythm.metrics.records import RunRecord
from polyrhythm.runtime.checkpoint import Resume


def process_name(rank: int) -> str:
    """The name each rank's process shows in ps/top (/proc/PID/comm)."""
    return f"polyrhythm-r{rank}"



def rank_main(config_values: dict, rank: int, rendezvous: str, record: RunRecord, events,
               alive, resume: Resume | None) -> None:
    """Entry point of one rank; `events`: its pipe to the launcher (launch/process/events.py)."""
    # Everything the forkserver imported (torch, polyrhythm) is shared with it, page by page,
    # until written. A full garbage collection writes to every object it walks: out of the
    # collector's sight, those pages stay shared (a collection that fell on the rank's first
    # import had cost 0.1 s a run, as how many objects the preload made decided when it ran).
    gc.freeze()
    runlock.hold(record.dir)  # until this process ends: a resume waits for it (runlock.py)
    bind_to_launcher(rank, alive)
    _redirect_output(record.log_path(rank))
    from polyrhythm.config import RunConfig

    config = RunConfig(**config_values)

    def join() -> None:
        group.join(rank, config.world_size, config.timeout,
                   store=group.file_store(rendezvous, config.world_size, config.timeout))

    try:
        lifecycle(config, rank, join, record if rank == 0 else None,
                  progress=lambda e: send(events, e), run_dir=record.dir, resume=resume)
        code = 0
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # its kind to the launcher; a bug's traceback to the log
        failure = RankFailure.of(rank, exc)
        failure.log(exc, sys.stderr)
        send(events, {"failure": failure.as_dict()})  # in the pipe once sent: nothing to flush
        code = 1
    leave_now(code)


def _leave_with_launcher(alive) -> None:
    alive.poll(None)  # returns at end-of-file: the launcher is gone
    leave_now(1)


def _redirect_output(path) -> None:
    """Send everything the rank prints, Python or C++ (Gloo), to its log file: the terminal
    belongs to the launcher, which reports one line per failure."""
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)


def bind_to_launcher(rank: int, alive) -> None:
    """Die with the launcher, and show a recognisable process name.

    The launcher holds the other end of `alive` and never writes into it: end-of-file means
    it is gone, even killed by SIGKILL, and a thread then ends this rank whatever it is doing
    (a rank also holds the forkserver's own liveness pipe open, so the forkserver cannot be
    relied on to exit first). The parent-death signal ends it if the forkserver is killed."""
    signal_on_parent_death(signal.SIGKILL)
    set_process_name(process_name(rank))
    threading.Thread(target=_leave_with_launcher, args=(alive,), daemon=True,
                     name="launcher-watch").start()
    signal.signal(signal.SIGINT, signal.default_int_handler)
