"""Signals as every launcher handles them: handlers for a block (SIGTERM as Ctrl-C while a
run goes on, both ignored while it is torn down), and how long a process is given to end
before it is killed."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

GRACE_S = 3.0  # how long a rank is given to end, or to show the error that ends the run


@contextlib.contextmanager
def signal_handlers(**handlers) -> Iterator[None]:
    """Install signal handlers (by lower-case name) for a block, where Python allows it (the
    main thread); restore the previous ones after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = {getattr(signal, name.upper()): h for name, h in handlers.items()}
    previous = {n: signal.signal(n, h) for n, h in numbers.items()}
    try:
        yield
    finally:
        for n, h in previous.items():
            signal.signal(n, h)


def raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
