"""Per-run measures (from the event series, else from the summary) and statistics over repeats.

Every measure returns None (or an empty result) where a run has no data for it: older runs
and strategies without servers have empty series or lack summary keys.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np

from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.report.data import Run


@dataclass(frozen=True)
class Stats:
    """Mean, sample standard deviation, min and max of the values that exist."""

    mean: float
    std: float
    min: float
    max: float
    n: int


def stats(values) -> Stats | None:
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not clean:
        return None
    array = np.array(clean)
    std = float(array.std(ddof=1)) if len(array) > 1 else 0.0
    return Stats(float(array.mean()), std, float(array.min()), float(array.max()), len(array))


def column_stats(rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per position over equally long rows holding NaN for gaps: mean, std, min, max, n."""
    matrix = np.vstack(rows)
    n = np.sum(~np.isnan(matrix), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # positions no repeat has
        std = np.where(n > 1, np.nanstd(matrix, axis=0, ddof=1) if len(rows) > 1 else 0.0, 0.0)
        return {"mean": np.nanmean(matrix, axis=0), "std": std,
                "min": np.nanmin(matrix, axis=0), "max": np.nanmax(matrix, axis=0), "n": n}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _headline(run: Run, key: str) -> float | None:
    """A figure the runs row holds, else the summary."""
    value = _number(run.row.get(key))
    return value if value is not None else _number(run.summary.get(key))


def final_accuracy(run: Run) -> float | None:
    return _headline(run, "final_val_accuracy")


def time_to_accuracy(run: Run, target: float) -> float | None:
    """Seconds from the job's start to the end of the first epoch whose validation accuracy
    reached `target` (a fraction); None if none did."""
    for epoch in sorted(run.epochs, key=lambda e: e["epoch"]):
        accuracy, wall = _number(epoch.get("val_accuracy")), _number(epoch.get("wall_s"))
        if accuracy is not None and wall is not None and accuracy >= target:
            return wall
    return None


def throughput(run: Run) -> float | None:
    """Samples/s of the whole cluster, warm-up excluded."""
    return _headline(run, "samples_per_s")


def wall_time(run: Run) -> float | None:
    return _headline(run, "wall_s")


def weight_updates(run: Run) -> float | None:
    """Updates applied to the model (each shard applies as many)."""
    value = _number(run.summary.get("weight_updates"))
    if value is not None:
        return value
    servers = run.column("updates", "server")
    return float(Counter(servers.tolist()).most_common(1)[0][1]) if len(servers) else None


def bytes_per_step(run: Run) -> float | None:
    """Bytes every rank sent (point to point, and the payload it handed to Gloo's own
    collectives), summed over the ranks, per worker step (the workers' steps summed)."""
    traffic = run.summary.get("traffic_per_rank") or []
    steps = sum(_number(w.get("steps")) or 0.0 for w in run.summary.get("per_worker") or [])
    if not traffic or not steps:
        return None
    return sum((_number(rank.get("bytes_sent")) or 0.0)
               + (_number(rank.get("native_collective_bytes")) or 0.0)
               for rank in traffic) / steps


def staleness_counts(run: Run) -> dict[int, int]:
    """{staleness: applied gradients} from the servers' pushes, else the summary."""
    pushes = run.column("pushes", "staleness")
    if len(pushes):
        return {int(s): n for s, n in sorted(Counter(pushes.astype(int).tolist()).items())}
    histogram = run.summary.get("staleness_histogram") or {}
    try:
        return {int(s): int(n) for s, n in sorted(histogram.items(), key=lambda i: int(i[0]))}
    except (TypeError, ValueError, AttributeError):
        return {}


def staleness_mean(run: Run) -> float | None:
    """Mean staleness of applied gradients; None without servers (nothing is stale)."""
    counts = staleness_counts(run)
    if counts:
        return sum(s * n for s, n in counts.items()) / sum(counts.values())
    return _number(run.summary.get("staleness_mean")) if run.row.get("servers") else None


def _steady_iterations(run: Run) -> np.ndarray:
    """Mask of iterations to average: each worker's warm-up steps left out (the summary's
    `warmup_steps`, as its samples/s does, else the first), where steps remain after them."""
    workers, steps = run.column("iterations", "worker"), run.column("iterations", "step")
    warmup = _number(run.summary.get("warmup_steps"))
    keep = np.ones(len(workers), dtype=bool)
    for w in np.unique(workers):
        mine = np.flatnonzero(workers == w)
        first = steps[mine].min()
        warm = mine[steps[mine] < first + (1 if warmup is None else warmup)]
        if len(warm) < len(mine):
            keep[warm] = False
    return keep


def phase_seconds(run: Run) -> dict[str, float] | None:
    """Mean seconds per iteration in each phase, and 'other' (the rest of the iteration)."""
    total = run.column("iterations", "total_s")
    if len(total):
        keep = _steady_iterations(run)
        means = {p: float(run.column("iterations", f"{p}_s")[keep].mean()) for p in SPAN_NAMES}
        whole = float(total[keep].mean())
    else:
        workers = [w for w in run.summary.get("per_worker") or [] if w.get("steps")]
        steps = sum(w["steps"] for w in workers)
        if not steps or not any(f"{p}_s" in w for w in workers for p in SPAN_NAMES):
            return None
        means = {p: sum(_number(w.get(f"{p}_s")) or 0.0 for w in workers) / steps
                 for p in SPAN_NAMES}
        whole = sum(_number(w.get("train_s")) or 0.0 for w in workers) / steps
    means["other"] = max(0.0, whole - sum(means.values()))
    return means


def idleness(run: Run) -> list[float]:
    """Per worker: seconds waiting / seconds in iterations."""
    workers, total = run.column("iterations", "worker"), run.column("iterations", "total_s")
    if len(total):
        wait = run.column("iterations", "wait_s")
        return [float(wait[workers == w].sum() / total[workers == w].sum())
                for w in np.unique(workers) if total[workers == w].sum() > 0]
    values = [_number(w.get("idleness")) for w in run.summary.get("per_worker") or []]
    return [v for v in values if v is not None]


def latencies_ms(run: Run, phase: str) -> np.ndarray:
    """Per-iteration seconds of push or pull, in ms (steady iterations)."""
    values = run.column("iterations", f"{phase}_s")
    return values[_steady_iterations(run)] * 1000 if len(values) else values
