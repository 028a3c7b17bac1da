"""The fidelity guard: was the emulator itself the bottleneck of an emulated run?

Emulated hosts share this machine's cores. A host is given a CPU share (its quota, or, with
no quota, all the cores a real machine of its own would give it); a figure is faithful only
while every host gets its share whenever it wants it. Twice a second the guard reads, per
host, how long its threads ran and how long they waited to run (/proc/<tid>/schedstat), and
how busy the machine was (/proc/stat). A host was *starved* in an interval when the machine
was saturated (>= 90 % of its cores busy), the host's threads waited to run (>= 0.1 threads
on average) and it ran less than 90 % of its share: it wanted CPU that a real host would
have had. A host starved in 10 % or more of the intervals makes the run emulator-bound
(Mininet-HiFi's check, Handigol et al., CoNEXT 2012: the emulator must not be the
bottleneck). Only the intervals within the training window count: the ranks importing torch
on every host at once saturate the machine by design.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

INTERVAL_S = 0.5
SATURATED = 0.9       # machine: share of its cores busy
WAITING = 0.1         # host: threads waiting to run, on average
SHORT_OF_SHARE = 0.9  # host: ran less than this share of its quota
BOUND = 0.1           # host: starved in at least this share of the intervals


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the machine since boot."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def thread_times(tids: list[int]) -> dict[int, tuple[int, int]]:
    """Per thread: nanoseconds run and waited to run (gone threads left out)."""
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/{tid}/schedstat") as f:
                ran, waited, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[tid] = (int(ran), int(waited))
    return out


class FidelityGuard:
    """Samples hosts while a run goes on (`start`, `stop`), then says how each fared.

    `threads[h]()` lists host h's threads; `shares[h]` is its CPU quota in cores (None: no
    quota, a whole machine's cores)."""

    def __init__(self, threads: list[Callable[[], list[int]]],
                 shares: list[float | None]) -> None:
        self.threads, self.cores = threads, os.cpu_count() or 1
        # A share above the machine's cores cannot be met: it is all the cores.
        self.shares = [min(s, self.cores) if s is not None else float(self.cores)
                       for s in shares]
        # (when, machine busy, per host (cores ran, threads waiting)), `when` in epoch seconds
        self.samples: list[tuple[float, float, list[tuple[float, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fidelity")

    def start(self) -> FidelityGuard:
        self._thread.start()
        return self

    def _run(self) -> None:
        clock, ticks = time.monotonic(), machine_ticks()
        seen = [thread_times(t()) for t in self.threads]
        while not self._stop.wait(INTERVAL_S):
            now_clock, now_ticks = time.monotonic(), machine_ticks()
            now = [thread_times(t()) for t in self.threads]
            # Per second of the interval as it was, not as planned: on a saturated machine
            # this thread wakes late.
            seconds = (now_clock - clock) * 1e9
            busy = (now_ticks[0] - ticks[0]) / max(1, now_ticks[1] - ticks[1])
            hosts = []
            for before, after in zip(seen, now, strict=True):
                common = after.keys() & before.keys()
                ran = sum(after[t][0] - before[t][0] for t in common) / seconds
                waited = sum(after[t][1] - before[t][1] for t in common) / seconds
                hosts.append((ran, waited))
            self.samples.append((time.time(), busy, hosts))
            clock, ticks, seen = now_clock, now_ticks, now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def verdict_over(self, start: float, end: float) -> dict:
        """Stop sampling; the verdict over the intervals that ended within [start, end]
        (epoch seconds: the training window)."""
        self.stop()
        return self.verdict([s[1:] for s in self.samples if start < s[0] <= end])

    def verdict(self, samples: list[tuple[float, list[tuple[float, float]]]]) -> dict:
        """Per host and for the run; with no samples (a run shorter than an interval) the
        verdict is unknown (None), not a pass."""
        hosts = []
        n = max(1, len(samples))
        for h, share in enumerate(self.shares):
            starved = sum(busy >= SATURATED and per[h][1] >= WAITING
                          and per[h][0] < SHORT_OF_SHARE * share
                          for busy, per in samples)
            hosts.append({
                "host": h, "cpu_share": share,
                "used_cores": sum(per[h][0] for _, per in samples) / n,
                "waiting_threads": sum(per[h][1] for _, per in samples) / n,
                "starved_fraction": starved / n,
                "emulator_bound": starved / n >= BOUND if samples else None})
        return {"machine_cores": self.cores,
                "machine_busy": sum(busy for busy, _ in samples) / n,
                "samples": len(samples),
                "emulator_bound": any(h["emulator_bound"] for h in hosts) if samples else None,
                "hosts": hosts}
