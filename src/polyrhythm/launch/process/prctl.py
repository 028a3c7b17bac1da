"""Linux's prctl(2) for the processes we start: a signal when the process that started one
dies (even by SIGKILL, which no code of its own sees), and the name ps and top show.

Torch-free: a Spark executor's Python worker imports it with launch/launchers/spark_task.py. Not
Linux: nothing happens, and each caller's own teardown still ends its processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def _prctl(option: int, value) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def signal_on_parent_death(sig: signal.Signals) -> None:
    """This process gets `sig` when its parent ends, however it ends."""
    _prctl(PR_SET_PDEATHSIG, sig)


def set_process_name(name: str) -> None:
    """The name this process shows in ps and top (/proc/PID/comm, 15 bytes)."""
    _prctl(PR_SET_NAME, name.encode())
