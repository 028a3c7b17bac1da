"""Waits that keep their own time.

Gloo's timeout, reached in any wait of a process, closes every connection the process has:
each later message, to any peer, fails ("Application timeout caused pair closure"; measured
on torch 2.13's Gloo). A rank that means to go on without a peer fallen silent (a worker
host cut off, which a parameter server's run survives) must never let a wait reach it. So
such a wait is handed to a thread of the peer's own, which waits with no timeout, while the
caller waits on the thread for as long as it will: it goes on, PeerSilent, if the peer stays
silent, and the thread is left waiting on a peer nobody talks to any more. A thread per peer,
made at its first such wait, takes the peer's waits in order; a hand-over costs a queue put
and an event, where a polling wait would cost a sleep's granularity on every message.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

from polyrhythm.comm.faults import PeerSilent, translated

NEVER = timedelta(days=365)  # Gloo's timeout for a wait this module keeps time for


class _Waiter:
    """A thread waiting on one peer's works, in the order given."""

    def __init__(self, peer: int) -> None:
        self.works: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name=f"wait-on-{peer}").start()

    def _run(self) -> None:
        while True:
            work, done = self.works.get()
            try:
                work.wait(NEVER)
            except Exception as exc:  # told to the caller, in its thread
                done.error = exc
            done.set()


class _Done(threading.Event):
    error: Exception | None = None


_waiters: dict[int, _Waiter] = {}
_lock = threading.Lock()


def wait_within(work, peer: int, within: float) -> None:
    """Wait for `work` (a send to or a receive from `peer`) for up to `within` seconds: raise
    what it failed with (as comm/faults.py reads it), or PeerSilent if it is not done by then
    (the work stays posted; Gloo never times it out)."""
    if work.is_completed():  # most are by now: no hand-over
        work.wait(NEVER)
        return
    with _lock:
        waiter = _waiters.get(peer) or _waiters.setdefault(peer, _Waiter(peer))
    done = _Done()
    waiter.works.put((work, done))
    if not done.wait(within):
        raise PeerSilent(peer, TimeoutError(f"Timed out waiting {within:g} s for it"))
    if done.error is not None:
        raise translated(done.error, peer)
