"""Latency injected into a rank's sends: the kernel here has no netem, so a message is held
by the sender for its one-way latency before it goes on the wire.

A send hands a copy of its tensor to the delay line and returns at once, as a send hands its
bytes to the kernel; a thread posts the real send when the message is due. Messages to the
same rank with the same tag leave in the order they were sent (with jitter a later message
waits for an earlier one), so receivers match them as they would without the delay.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


class Posted:
    """What a delayed send returns: complete once the copy is taken; failures of the real
    send surface when the delay line drains."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class DelayLine:
    """Sends of this rank, each posted (by `post`, dist.isend) `draw()` seconds after it was
    made."""

    def __init__(self, draw: Callable[[], float], post: Callable = dist.isend) -> None:
        self.draw, self.post = draw, post
        self._due: list[tuple[float, int, torch.Tensor, int, int]] = []
        self._order = itertools.count()
        self._last: dict[tuple[int, int], float] = {}  # per (dst, tag): due of the last send
        self._sent: list[tuple[dist.Work, torch.Tensor]] = []  # posted, maybe not complete
        self._error: Exception | None = None
        self._cv = threading.Condition()
        threading.Thread(target=self._post, daemon=True, name="delay-line").start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Posted:
        due = time.monotonic() + self.draw()
        with self._cv:
            if self._error is not None:
                raise self._error
            due = max(due, self._last.get((dst, tag), 0.0))
            self._last[dst, tag] = due
            heapq.heappush(self._due, (due, next(self._order), tensor.clone(), dst, tag))
            self._cv.notify()
        return Posted()

    def hold(self, rounds: int) -> None:
        """Hold the caller for the latency of `rounds` messages one after the other: what a
        collective the engine runs in one call pays for its message rounds."""
        time.sleep(sum(self.draw() for _ in range(rounds)))

    def drain(self) -> None:
        """Return once every message sent so far is on the wire and its send complete."""
        with self._cv:
            while self._due:
                self._cv.wait()
            sent, self._sent = self._sent, []
            if self._error is not None:
                raise self._error
        for work, _ in sent:
            work.wait()

    def _post(self) -> None:
        while True:
            with self._cv:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cv.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, tensor, dst, tag = self._due[0]
            try:
                work = self.post(tensor, dst, tag=tag)
            except Exception as exc:  # the peer is gone: the next send or drain raises
                work, self._error = None, exc
            with self._cv:
                heapq.heappop(self._due)
                if work is not None:  # keep the copy alive until its send completes
                    self._sent = [(w, t) for w, t in self._sent if not w.is_completed()]
                    self._sent.append((work, tensor))
                self._cv.notify_all()
