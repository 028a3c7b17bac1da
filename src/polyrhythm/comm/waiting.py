"""Waits that keep their own time, and learn of a peer gone from a watch on it.

Gloo's timeout, reached in any wait of a process, closes every connection the process has:
each later message, to any peer, fails ("Application timeout caused pair closure"; measured
on torch 2.13's Gloo). A rank that means to go on without a peer fallen silent (a worker
host cut off, which a parameter server's run survives) must never let a wait reach it. So
such a wait is handed to a thread of the peer's own, which waits with no timeout, while the
caller waits on the thread for as long as it will: it goes on, PeerSilent, if the peer stays
silent, and the thread is left waiting on a peer nobody talks to any more. A thread per peer,
made at its first such wait, takes the peer's waits in order; a hand-over costs a queue put
and an event, where a polling wait would cost a sleep's granularity on every message.

A peer whose connection breaks is gone for every work with it, but Gloo fails only the works
it holds as posted (tcp/pair.cc's signalException: the receives and sends waiting for their
peer's side). A send already being written (its message queued behind a full socket, or the
peer's reset met as it was written) and a receive already being read (a message cut short)
are left neither done nor failed, and a wait on one lasts for ever (measured: a peer stopped
with a 64 MB message on its way to it, or from it, then killed). A server that replied to a
worker in the instant it died waited so, and the run with it. So each peer waited on here is
watched: a receive from it on a tag nothing is ever sent on (comm/messages.py's WATCH), which
Gloo fails the moment the peer's connection breaks, whatever broke it. Its failure marks the
peer gone, and every wait on that peer ends at once with it (`gone`: for a rank's own receive
threads, which a peer gone leaves waiting too).
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch

from polyrhythm.comm.faults import PeerFault, PeerSilent, translated
from polyrhythm.comm.messages import WATCH
from polyrhythm.comm.posting import post_receive

NEVER = timedelta(days=365)  # Gloo's timeout for a wait this module keeps time for


class Waiter:
    """A thread waiting on one peer's works, in the order given (`works.put((work, done))`;
    `done`, an event with an `error`, is set when the work ends, with what it failed with).
    Here, one per peer for the process; comm/membership.py, one per peer and generation."""

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


_lock = threading.Lock()
_waiters: dict[int, Waiter] = {}
_watched: set[int] = set()
_gone: dict[int, Exception] = {}  # by peer: Gloo's error for its broken connection
_waits: dict[int, set[_Done]] = {}  # by peer: the waits on it in progress


def wait_within(work, peer: int, within: float) -> None:
    """Wait for `work` (a send to or a receive from `peer`) for up to `within` seconds: raise
    what it failed with (as comm/faults.py reads it), what broke the peer's connection if it
    breaks first (PeerLost), or PeerSilent if it is not done by then (the work stays posted;
    Gloo never times it out)."""
    if work.is_completed():  # most are by now: no hand-over
        work.wait(NEVER)
        return
    watch(peer)
    done = _Done()
    with _lock:
        if peer in _gone:
            raise translated(_gone[peer], peer)
        waiter = _waiters.get(peer) or _waiters.setdefault(peer, Waiter(peer))
        _waits.setdefault(peer, set()).add(done)
    waiter.works.put((work, done))
    try:
        ended = done.wait(within)
    finally:
        with _lock:
            _waits.get(peer, set()).discard(done)
    if not ended:
        raise PeerSilent(peer, TimeoutError(f"Timed out waiting {within:g} s for it"))
    if done.error is not None:
        raise translated(done.error, peer)


def watch(peer: int) -> None:
    """Watch `peer` from now on (once): its receive nothing answers, waited on by a thread,
    whose failure marks the peer gone. Posted once the connection has broken, it fails as
    it is posted."""
    with _lock:
        if peer in _watched:
            return
        _watched.add(peer)
    try:
        work = post_receive(torch.empty(1), peer, WATCH)
    except RuntimeError as exc:
        if not _went(peer, exc):
            raise
        return
    threading.Thread(target=_watch, args=(work, peer), daemon=True,
                     name=f"watch-{peer}").start()


def _watch(work, peer: int) -> None:
    try:
        work.wait(NEVER)
    except RuntimeError as exc:
        _went(peer, exc)


def _went(peer: int, exc: Exception) -> bool:
    """If `exc` (Gloo's error on the watch) says `peer`'s connection broke (or timed out),
    every wait on it ends now; whether it did (any other error is no news of the peer)."""
    if not isinstance(translated(exc, peer), PeerFault):
        return False
    with _lock:
        _gone.setdefault(peer, exc)
        waits = _waits.pop(peer, set())
    for done in waits:
        done.error = exc
        done.set()
    return True


def gone(peer: int) -> Exception | None:
    """What broke `peer`'s connection, as comm/faults.py reads it (PeerLost, mostly), if a
    watch on it saw it break; None while it holds (or nobody watches it)."""
    with _lock:
        exc = _gone.get(peer)
    return None if exc is None else translated(exc, peer)
