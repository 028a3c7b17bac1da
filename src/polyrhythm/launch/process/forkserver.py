"""The forkserver a local run forks its ranks from, and the environment it starts with.

It imports torch and the runtime (PRELOAD) once, and every rank is forked with them loaded
(launch/launchers/local.py). A launcher starts it with the first rank, or earlier (`start`):
`polyrhythm train` starts it as soon as the config is checked, so that it imports torch while the
launcher imports torch itself, two processes on two cores, instead of one after the other
(a second and more of every local run's start-up on this machine). This module imports no
torch, so that starting it costs the launcher nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from multiprocessing import forkserver

# Imported once by the forkserver; every rank is forked with them loaded: a built-in job's
# (forked, life) and a script's (preloaded, and script_rank: what polyrhythm.init() imports).
PRELOAD = ["polyrhythm.launch.rank.forked", "polyrhythm.launch.rank.life",
           "polyrhythm.launch.rank.preloaded", "polyrhythm.launch.rank.script_rank"]
# torch._dynamo: the first torch.optim optimizer a process makes imports it (1.2-2.3 s of CPU
# here), so without it every rank of a script paid that on its own; preloaded, the ranks share
# its pages (about 70 MB each, mostly shared) and a script run starts seconds sooner.
# polyrhythm train's job makes none, and its command starts a forkserver of its own for its
# one run: importing it there would delay that run's ranks (0.8 s of each run's start here).
FOR_SCRIPTS = [*PRELOAD, "torch._dynamo"]
_preload = FOR_SCRIPTS  # what this process's forkserver imports (start chooses)
CHILD_ENVIRONMENT = {"GOMP_SPINCOUNT": "10000", "GLOO_SOCKET_IFNAME": "lo"}


def context():
    """The forkserver context, with the runtime to preload."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preload)
    return ctx


def start(scripts: bool = True) -> None:
    """Start the forkserver now, in the ranks' environment, for a script's ranks or
    (`scripts` False) polyrhythm train's. It keeps running for this process's later runs and
    ends when this process does: told to at exit, since one still importing torch would
    notice this process gone only once it has (a launcher that refuses its data or model
    after this ends at once)."""
    global _preload
    _preload = FOR_SCRIPTS if scripts else PRELOAD
    context()
    with child_environment():
        forkserver.ensure_running()
    atexit.register(_stop, forkserver._forkserver._forkserver_pid)


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def child_environment() -> Iterator[None]:
    """Environment the ranks start with (read by OpenMP when a rank imports torch).

    OpenMP's idle threads spin for a long time by default; on a machine shared by several
    ranks, a worker's spinning thread steals the core its server and Gloo's I/O threads need
    during push/pull (measured on 2 cores: push 1.9 ms -> 0.3 ms per step). Passive waiting
    (no spin) slows compute instead (+10 % per step), as threads sleep between operators; a
    short spin keeps them warm within a step and asleep between steps. Gloo binds loopback
    only (GLOO_SOCKET_IFNAME=lo): torch.distributed has no authentication, so a local run
    listens to nobody beyond this machine. A value the user set
    is kept. Ranks fork from the forkserver, so they get the environment it was started
    with, by the first run of this process (or `start`): later changes do not reach them.
    """
    added = {k: v for k, v in CHILD_ENVIRONMENT.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            del os.environ[key]
