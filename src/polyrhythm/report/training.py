"""Figures of learning and scaling: accuracy over time and epochs; throughput, speed-up and
scaling efficiency against the worker count."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from polyrhythm.report.data import Group, Run
from polyrhythm.report.measures import column_stats, stats, throughput
from polyrhythm.report.plot import (
    BAND_NOTE,
    NoData,
    band,
    from_zero,
    legend,
    new_figure,
    note,
    points,
)


def group_name(group: Group) -> str:
    n = len(group.runs)
    return f"{group.label} ({n} runs)" if n > 1 else group.label


def bands_over_time(ax, groups: list[Group], table: str, last: Callable[[Run], float],
                    bins: Callable[[list[Run], float], int],
                    curve: Callable[[Run, np.ndarray], np.ndarray]) -> list[str]:
    """Per group, a band over time bins from 0 to its runs' latest `last(run)`: `curve(run,
    edges)` is a run's value in each bin, `bins(runs, end)` how many bins. Only runs with rows
    in the event `table` count; returns the labels of groups with none."""
    missing = []
    for group in groups:
        runs = [r for r in group.runs if len(r.column(table, "t"))]
        if not runs:
            missing.append(group.label)
            continue
        end = max(last(r) for r in runs)
        edges = np.linspace(0, end, bins(runs, end) + 1)
        centres = (edges[:-1] + edges[1:]) / 2
        band(ax, centres, column_stats([curve(r, edges) for r in runs]), group,
             group_name(group))
    return missing


def _epoch_columns(group: Group, keys: tuple[str, ...]):
    """Epoch numbers any run of the group has every key for, and per key the stats over runs."""
    per_run = [{e["epoch"]: e for e in r.epochs if all(e.get(k) is not None for k in keys)}
               for r in group.runs]
    epochs = sorted(set().union(*per_run))
    if not epochs:
        return None, {}
    return np.array(epochs), {
        k: column_stats([np.array([float(d[e][k]) if e in d else np.nan for e in epochs])
                         for d in per_run]) for k in keys}


def _accuracy(groups: list[Group], by_time: bool):
    fig, (ax,) = new_figure()
    missing = []
    for group in groups:
        keys = ("val_accuracy", "wall_s") if by_time else ("val_accuracy",)
        epochs, columns = _epoch_columns(group, keys)
        if epochs is None:
            missing.append(group.label)
            continue
        x = columns["wall_s"]["mean"] if by_time else epochs + 1
        band(ax, x, columns["val_accuracy"], group, group_name(group), scale=100)
    if len(missing) == len(groups):
        raise NoData("no run has per-epoch validation accuracy")
    ax.set_xlabel("wall time since training started (s), mean over repeats" if by_time
                  else "epochs completed")
    if not by_time:
        ax.set_xticks(sorted({int(e["epoch"]) + 1 for g in groups for r in g.runs
                              for e in r.epochs}))
    ax.set_ylabel("validation accuracy (%)")
    marked = mark_switches(ax, groups, by_time)
    note(ax, BAND_NOTE + marked + (f"; no epochs for {', '.join(missing)}" if missing else ""))
    legend(ax, title="group")
    return fig


def mark_switches(ax, groups: list[Group], by_time: bool) -> str:
    """A dotted line, in the group's colour, where each Strategy-Switch run switched: at its
    wall time, or after its switch epoch. Returns the note's words for it ('' if none)."""
    marked = False
    for group in groups:
        for run in group.runs:
            key = "switched_at_s" if by_time else "switch_epoch"
            if (at := run.summary.get(key)) is None:
                continue
            ax.axvline(float(at), color=group.color, linestyle=":", linewidth=1.4,
                       label=None if marked else "switch (one line per run)")
            marked = True
    return "; dotted: a run's switch" if marked else ""


def mark_losses(ax, groups: list[Group]) -> str:
    """A dashed line, in the group's colour, where a run lost a worker and went on (its
    membership changed). Returns the note's words for it ('' if none)."""
    marked = False
    for group in groups:
        for run in group.runs:
            for lost in run.summary.get("lost_workers", []):
                if lost["at_s"] is None:  # seen only after training
                    continue
                ax.axvline(float(lost["at_s"]), color=group.color, linestyle="--",
                           linewidth=1.2, label=None if marked else "a worker lost")
                marked = True
    return "; dashed: a worker lost, the others going on" if marked else ""


def throughput_vs_time(groups: list[Group]):
    """Samples/s of all workers over the run, from the iterations each worker finished in
    each time bin (its batch per iteration)."""
    fig, (ax,) = new_figure()
    missing = bands_over_time(ax, groups, "iterations", lambda r: float(_ends(r).max()),
                              lambda runs, end: int(np.clip(end / 0.5, 5, 60)),
                              _samples_per_s)
    if len(missing) == len(groups):
        raise NoData("no run recorded its iterations (instrumentation off)")
    ax.set_xlabel("time since job start (s)")
    ax.set_ylabel("throughput (samples/s, all workers)")
    from_zero(ax)
    marked = mark_switches(ax, groups, by_time=True) + mark_losses(ax, groups)
    note(ax, BAND_NOTE + marked + (f"; no iterations for {', '.join(missing)}" if missing
                                   else ""))
    legend(ax, title="group")
    return fig


def worker_batches(run: Run) -> np.ndarray:
    """Each worker's samples a step: a script's, its loaders' (its summary's: its config's
    batch_size is not what it trained); else the config's global batch, split as the
    workers split it."""
    given = run.summary.get("worker_batch_size")
    if given and len(given) == run.workers:  # by worker index; None: one lost, unrecorded
        return np.array([b or 0 for b in given], dtype=float)
    batch, n = int(run.config.get("batch_size", 0)), run.workers
    return np.array([batch // n + (i < batch % n) for i in range(n)], dtype=float)


def _samples_per_s(run: Run, edges: np.ndarray) -> np.ndarray:
    """Samples finished per second in each bin; NaN past the run's last iteration."""
    worker = run.column("iterations", "worker").astype(int)
    ends = _ends(run)
    samples, _ = np.histogram(ends, bins=edges, weights=worker_batches(run)[worker])
    rate = samples / np.diff(edges)
    rate[edges[:-1] > ends.max()] = np.nan
    return rate


def accuracy_vs_time(groups: list[Group]):
    return _accuracy(groups, by_time=True)


def accuracy_vs_epoch(groups: list[Group]):
    return _accuracy(groups, by_time=False)


_YLABELS = {
    "throughput": "throughput (samples/s, all workers)",
    "speedup": "speed-up over the smallest worker count N0 (×)",
    "efficiency": "scaling efficiency: speed-up / (N/N0)",
}


def _scaling(groups: list[Group], kind: str):
    """Per family (a strategy and the fields other than N that vary), one point per N."""
    families: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        families[group.family].append(group)
    fig, (ax,) = new_figure()
    singles, counts, bases = [], set(), set()
    for family, members in families.items():
        by_n: dict[int, list[float]] = defaultdict(list)
        for run in (r for g in members for r in g.runs):
            if (value := throughput(run)) is not None and value > 0:
                by_n[run.workers].append(value)
        if not by_n:
            continue
        n0 = min(by_n)
        base = float(np.mean(by_n[n0]))
        xs = sorted(by_n)
        values = [stats(_scaled(kind, v, n, n0, base) for v in by_n[n]) for n in xs]
        repeats = sorted({len(v) for v in by_n.values()})
        name = family + ("" if repeats == [1] else f" ({repeats[0]} runs per N)"
                         if len(repeats) == 1 else f" ({repeats[0]}-{repeats[-1]} runs per N)")
        points(ax, xs, values, members[0].color, members[0].marker, name)
        counts.update(xs)
        if len(xs) == 1:
            singles.append(f"{family} (N={xs[0]})")
        else:
            bases.add((n0, max(xs)))
    if not counts:
        raise NoData("no completed run has a throughput (samples/s)")
    _ideal(ax, kind, bases)
    ax.set_xlabel("workers N")
    ax.set_ylabel(_YLABELS[kind])
    ax.set_xticks(sorted(counts))
    if len(counts) == 1:
        ax.set_xlim(min(counts) - 1, min(counts) + 1)
    from_zero(ax)
    text = "marker: mean over repeats; thick bar: ±1 std; thin capped bar: min-max"
    if singles:
        text += ("; only one worker count" + (" per strategy" if len(singles) == len(families)
                 else f" for {', '.join(singles)}") + ": single points, no scaling curve")
    note(ax, text)
    legend(ax, title="strategy (fields that vary)" if len(families) > 1 else None)
    return fig


def _scaled(kind: str, value: float, n: int, n0: int, base: float) -> float:
    """Throughput as is, or speed-up over the mean at N0, or that per N/N0."""
    if kind == "throughput":
        return value
    return value / base if kind == "speedup" else value / base / (n / n0)


def _ideal(ax, kind: str, bases: set[tuple[int, int]]) -> None:
    if kind == "efficiency":
        ax.axhline(1.0, color="0.5", linestyle="--", linewidth=1, label="ideal")
    elif kind == "speedup":
        for i, (n0, top) in enumerate(sorted(bases)):
            ax.plot([n0, top], [1, top / n0], color="0.5", linestyle="--", linewidth=1,
                    label="ideal (N/N0)" if i == 0 else None)


def throughput_vs_workers(groups: list[Group]):
    return _scaling(groups, "throughput")


def speedup_vs_workers(groups: list[Group]):
    return _scaling(groups, "speedup")


def efficiency_vs_workers(groups: list[Group]):
    return _scaling(groups, "efficiency")


def _ends(run: Run) -> np.ndarray:
    """When each recorded iteration ended (seconds since the job started)."""
    return run.column("iterations", "t") + run.column("iterations", "total_s")
