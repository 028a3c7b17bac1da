"""Cheap per-process instruments: named time spans and staleness counts."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

# What a training iteration is made of, for every strategy: the spans each worker records per
# iteration, the `<span>_s` columns of the store's iterations table and the report's phases.
SPAN_NAMES = ("compute", "push", "wait", "pull", "apply")


class Spans:
    """Seconds spent in each named span (compute, push, wait, pull, apply, update): in all,
    and since the last `take()` (one training iteration)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.current: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.totals[name] += elapsed
            self.current[name] += elapsed

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
