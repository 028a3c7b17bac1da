"""Whether any rank still works on a run: every rank the local launcher starts holds a shared
lock on `<run>/ranks.lock` for its whole life. The kernel lets go of a process's lock when it
ends, however it ends (SIGKILL included), so a launcher about to resume a run can wait until
the ranks of an earlier launch, orphaned when their launcher was killed, have left: they
leave on their own once they see their launcher gone, but not in the same instant, and one
still writing a checkpoint while the resumed run starts would be another launcher's rank on
the same files.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from polyrhythm.errors import StoreError

LOCK_FILE = "ranks.lock"
ORPHANS_TIMEOUT_S = 30.0  # an orphaned rank leaves within a moment of its launcher's death
_POLL_S = 0.05


def hold(run_dir: Path) -> None:
    """This process works on the run in `run_dir` until it ends: take a shared hold that
    lasts as long as the process (the descriptor is never closed)."""
    fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)


def wait_until_free(run_dir: Path, timeout: float = ORPHANS_TIMEOUT_S) -> None:
    """Return once no process holds the run in `run_dir` (at once if none ever did); a
    one-line StoreError if some still does after `timeout` seconds."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # no rank of this run ever started here
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"processes of an earlier launch of run {Path(run_dir).name} still "
                        f"run after {timeout:g} s (ps shows them as polyrhythm-r<rank>): end "
                        "them, then resume") from None
                time.sleep(_POLL_S)
    finally:
        os.close(fd)  # and with it the exclusive lock: it only asked whether anyone holds one
