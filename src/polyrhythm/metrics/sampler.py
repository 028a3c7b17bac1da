"""About once a second, what this process uses: CPU, memory and the bytes it has moved.

One sampler thread per rank (so it works the same under torchrun, on any host). psutil has no
per-process network counters; the bytes are the transport's own (point-to-point messages plus
the payload handed to native collectives), cumulative since the job started.
"""

from __future__ import annotations

import threading

import psutil

from polyrhythm.context import RankContext

SAMPLE_INTERVAL_S = 1.0
FIRST_SAMPLE_S = 0.25


class ResourceSampler:
    """Samples (rank, role, t, cpu %, rss bytes, bytes sent, bytes received) while in use."""

    def __init__(self, ctx: RankContext, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.ctx, self.interval_s = ctx, interval_s
        self.role = ctx.topology.role(ctx.rank)
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
        traffic = self.ctx.transport.counters
        native = traffic.native_collective_bytes
        self.samples.append((self.ctx.rank, self.role, self.ctx.now(),
                             self._process.cpu_percent(None), self._process.memory_info().rss,
                             traffic.bytes_sent + native, traffic.bytes_received + native))
