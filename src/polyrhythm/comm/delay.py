"""Latency injected into a rank's sends: the kernel here has no netem, so a message is held
by the sender for its one-way latency before it goes on the wire.

A send hands a copy of its tensor to the delay line and returns at once, as a send hands its
bytes to the kernel; a thread posts the real send when the message is due. Messages to the
same rank with the same tag leave in the order they were sent (with jitter a later message
waits for an earlier one), so receivers match them as they would without the delay. As a
socket's buffer does, the line takes at most IN_FLIGHT messages per destination that are not
yet delivered; a further send to it waits, so a slow link still slows its sender.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

import torch

from polyrhythm.comm.faults import translated
from polyrhythm.comm.posting import post_send

IN_FLIGHT = 8


class Posted:
    """What a delayed send returns: complete once the line has its copy; failures of the
    real send surface at the next send or when the line drains."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class DelayLine:
    """Sends of this rank, each posted (by `post`, posting.post_send) `draw()` seconds after
    it was made."""

    def __init__(self, draw: Callable[[], float], post: Callable = post_send) -> None:
        self.draw, self.post = draw, post
        self._due: list[tuple[float, int, torch.Tensor, int, int]] = []
        self._order = itertools.count()
        self._last: dict[tuple[int, int], float] = {}  # per (dst, tag): due of the last send
        # Per destination: posted sends, waited for in order by a thread of its own (a Gloo
        # send reports completion only to a wait), with their copies kept alive until then.
        self._posted: dict[int, queue.SimpleQueue] = {}
        self._pending: Counter[int] = Counter()  # per destination: made, not yet delivered
        self._error: Exception | None = None
        self._cv = threading.Condition()
        threading.Thread(target=self._post, daemon=True, name="delay-line").start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Posted:
        delay, copy = self.draw(), tensor.clone()
        with self._cv:
            while self._error is None and self._pending[dst] >= IN_FLIGHT:
                self._cv.wait()
            if self._error is not None:
                raise self._error
            due = max(time.monotonic() + delay, self._last.get((dst, tag), 0.0))
            self._last[dst, tag] = due
            self._pending[dst] += 1
            heapq.heappush(self._due, (due, next(self._order), copy, dst, tag))
            self._cv.notify_all()
        return Posted()

    def hold(self, rounds: int) -> None:
        """Hold the caller for the latency of `rounds` messages one after the other: what a
        collective the engine runs in one call pays for its message rounds."""
        time.sleep(sum(self.draw() for _ in range(rounds)))

    def drain(self) -> None:
        """Return once every message sent so far is on the wire and its send complete."""
        with self._cv:
            while self._error is None and any(self._pending.values()):
                self._cv.wait()
            if self._error is not None:
                raise self._error

    def _post(self) -> None:
        while True:
            with self._cv:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cv.wait(self._due[0][0] - time.monotonic() if self._due else None)
                # Off the heap before posting: a send made meanwhile may be due sooner.
                _, _, copy, dst, tag = heapq.heappop(self._due)
            try:
                work = self.post(copy, dst, tag=tag)
            except Exception as exc:  # e.g. the peer is gone: the next send or drain raises
                self._fail(translated(exc, dst))
                continue
            if dst not in self._posted:
                self._posted[dst] = queue.SimpleQueue()
                threading.Thread(target=self._complete, args=(dst,), daemon=True,
                                 name=f"delay-line-to-{dst}").start()
            self._posted[dst].put((work, copy))

    def _complete(self, dst: int) -> None:
        while True:
            work, _ = self._posted[dst].get()
            try:
                work.wait()
            except Exception as exc:
                self._fail(translated(exc, dst))
                return
            with self._cv:
                self._pending[dst] -= 1
                self._cv.notify_all()

    def _fail(self, exc: Exception) -> None:
        with self._cv:
            self._error = exc
            self._cv.notify_all()
