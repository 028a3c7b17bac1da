"""Cheap per-process instruments: named time spans and staleness counts."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

# What a training iteration is made of, for every strategy: the spans each worker records per
# iteration, the `<span>_s` columns of the store's iterations table and the report's phases.
# `compress`: encoding and decoding compressed messages (compression/); `read`: reading the
# step's data where a step reads it (mapreduce: each Spark task's cached partition).
SPAN_NAMES = ("compute", "push", "wait", "pull", "apply", "compress", "read")


class Spans:
    """Seconds spent in each named span (compute, push, wait, pull, apply, compress, update):
    in all, and since the last `take()` (one training iteration). A span opened inside
    another has its own time: the outer one is paused meanwhile (a push's encoding counts as
    compress, not push), so the spans never count a second twice."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.current: dict[str, float] = defaultdict(float)
        self._open: list[list] = []  # [name, since] of each open span, innermost last

    def _add(self, name: str, seconds: float) -> None:
        self.totals[name] += seconds
        self.current[name] += seconds

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        if self._open:
            outer = self._open[-1]
            self._add(outer[0], start - outer[1])
        self._open.append([name, start])
        try:
            yield
        finally:
            end = time.perf_counter()
            self._add(name, end - self._open.pop()[1])
            if self._open:
                self._open[-1][1] = end

    def take(self) -> dict[str, float]:
        """The seconds per span since the last call, and start counting anew."""
        current, self.current = self.current, defaultdict(float)
        return current


class StalenessLog:
    """Staleness of every applied gradient: updates applied between its pull and its push."""

    def __init__(self) -> None:
        self.histogram: Counter[int] = Counter()

    def record(self, staleness: int) -> None:
        self.histogram[staleness] += 1

    @staticmethod
    def summarise(histogram: Counter[int]) -> dict:
        """Mean, max and the histogram (as {staleness: count}) of merged logs."""
        count = sum(histogram.values())
        total = sum(s * n for s, n in histogram.items())
        return {
            "staleness_mean": total / count if count else 0.0,
            "staleness_max": max(histogram) if histogram else 0,
            "staleness_histogram": {str(s): histogram[s] for s in sorted(histogram)},
        }
