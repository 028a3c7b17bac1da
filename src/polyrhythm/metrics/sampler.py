"""About once a second, what this process uses: CPU, memory and the bytes it has moved.

One sampler thread per rank (so it works the same under torchrun, on any host). psutil has no
per-process network counters; the bytes are the transport's own (point-to-point messages plus
the payload handed to native collectives), cumulative since the job started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

SAMPLE_INTERVAL_S = 1.0
FIRST_SAMPLE_S = 0.25


class ResourceSampler:
    """Samples (rank, role, t, cpu %, rss bytes, bytes sent, bytes received) while in use.

    `now()` is the job's clock (seconds since it started); `moved()` the bytes this process
    has sent and received so far."""

    def __init__(self, rank: int, role: str, now: Callable[[], float],
                 moved: Callable[[], tuple[int, int]],
                 interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.rank, self.role, self.now, self.moved = rank, role, now, moved
        self.interval_s = interval_s
        self.samples: list[tuple] = []
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="resources")

    def __enter__(self) -> ResourceSampler:
        self._process.cpu_percent(None)  # starts the CPU clock: the first figure covers t=0..1
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the last stretch

    def _run(self) -> None:
        # A first sample soon after the start, so even a run of a second or two has the two
        # samples a rate (bytes/s) needs.
        wait = min(FIRST_SAMPLE_S, self.interval_s)
        while not self._stop.wait(wait):
            self._sample()
            wait = self.interval_s

    def _sample(self) -> None:
        sent, received = self.moved()
        self.samples.append((self.rank, self.role, self.now(), self._process.cpu_percent(None),
                             self._process.memory_info().rss, sent, received))
