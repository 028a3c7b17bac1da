"""Figures of where time goes and how servers behave: time breakdown, idleness, staleness,
weight updates, push and pull latency."""

from __future__ import annotations

import textwrap

import numpy as np

from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.report.data import Group
from polyrhythm.report.measures import (
    column_stats,
    idleness,
    latencies_ms,
    phase_seconds,
    staleness_counts,
    stats,
    weight_updates,
)
from polyrhythm.report.plot import (
    BAND_NOTE,
    NoData,
    from_zero,
    group_ticks,
    legend,
    new_figure,
    note,
    spread,
)
from polyrhythm.report.training import bands_over_time, group_name

PHASE_COLORS = {"compute": "#4c72b0", "push": "#dd8452", "wait": "#c44e52", "pull": "#55a868",
                "apply": "#8172b3", "compress": "#937860", "read": "#da8bc3",
                "other": "#c7c7c7"}
SPREAD_NOTE = "thick bar: ±1 std over repeats; thin capped bar: min-max"
STALENESS_CAP = 20  # larger staleness values share the last bar


def _skipped(text: str, groups: list[Group], shown: list[tuple]) -> str:
    """'; <text>: <labels>' for the groups a figure leaves out, else ''."""
    drawn = {row[0].label for row in shown}
    labels = [g.label for g in groups if g.label not in drawn]
    return f"; {text}: {', '.join(labels)}" if labels else ""


def breakdown(groups: list[Group]) -> list[tuple[Group, list[dict[str, float]]]]:
    """Groups with phase times, and each run's mean seconds per iteration per phase."""
    rows = [(g, [m for r in g.runs if (m := phase_seconds(r)) is not None]) for g in groups]
    return [(g, ms) for g, ms in rows if ms]


def time_breakdown(groups: list[Group]):
    rows = breakdown(groups)
    if not rows:
        raise NoData("no run has per-iteration timings")
    phases = [p for p in (*SPAN_NAMES, "other") if any(m[p] > 0 for _, ms in rows for m in ms)]
    fig, (ax,) = new_figure()
    bottom = np.zeros(len(rows))
    for phase in phases:
        heights = np.array([np.mean([m[phase] for m in ms]) * 1000 for _, ms in rows])
        ax.bar(range(len(rows)), heights, 0.6, bottom=bottom, color=PHASE_COLORS[phase],
               label=phase)
        bottom += heights
    spread(ax, range(len(rows)), [stats(sum(m[p] for p in phases) * 1000 for m in ms)
                                  for _, ms in rows])
    group_ticks(ax, [group_name(g) for g, _ in rows])
    ax.set_xlabel("group")
    ax.set_ylabel("time per iteration (ms, mean over steps and workers)")
    note(ax, "bars: mean over repeats; warm-up steps left out; error bars on the "
         f"total: {SPREAD_NOTE}" + _skipped("no timings for", groups, rows))
    ax.legend(title="phase", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def idleness_figure(groups: list[Group]):
    rows = [(g, [[v * 100 for v in idleness(r)] for r in g.runs]) for g in groups]
    rows = [(g, per_run) for g, per_run in rows if any(per_run)]
    if not rows:
        raise NoData("no run has per-worker wait times")
    fig, (ax,) = new_figure()
    rng = np.random.default_rng(0)
    for i, (group, per_run) in enumerate(rows):
        values = [v for run in per_run for v in run]
        ax.bar(i, np.mean(values), 0.6, color=group.color, alpha=0.75)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(values)), values, s=10, color="0.15",
                   zorder=5)
    spread(ax, range(len(rows)), [stats(v for run in per_run for v in run)
                                  for _, per_run in rows])
    group_ticks(ax, [group_name(g) for g, _ in rows])
    ax.set_xlabel("group")
    ax.set_ylabel("idleness: wait / iteration time (%)")
    from_zero(ax)
    note(ax, "bar: mean over workers and repeats; dot: one worker of one run; thick bar: ±1 "
         "std, thin capped bar: min-max, over workers and repeats"
         + _skipped("no wait times for", groups, rows))
    return fig


def _shares(counts: dict[int, int], top: int) -> np.ndarray:
    share = np.zeros(top + 1)
    total = sum(counts.values())
    for s, n in counts.items():
        share[min(s, top)] += 100 * n / total
    return share


def staleness_histogram(groups: list[Group]):
    rows = [(g, [c for r in g.runs if (c := staleness_counts(r))]) for g in groups]
    rows = [(g, cs) for g, cs in rows if cs]
    if not rows:
        raise NoData("no applied gradients with a staleness (no parameter servers)")
    top = min(STALENESS_CAP, max(s for _, cs in rows for c in cs for s in c))
    fig, (ax,) = new_figure()
    width = 0.8 / len(rows)
    x = np.arange(top + 1)
    for i, (group, cs) in enumerate(rows):
        shares = column_stats([_shares(c, top) for c in cs])
        offset = x + (i - (len(rows) - 1) / 2) * width
        ax.bar(offset, shares["mean"], width, color=group.color, label=group_name(group))
        spread(ax, offset, [stats(col) for col in np.vstack([_shares(c, top) for c in cs]).T])
    labels = [str(s) for s in x]
    if top == STALENESS_CAP:
        labels[-1] = f"≥{top}"
    ax.set_xticks(x, labels)
    ax.grid(False, axis="x")
    ax.set_xlabel("staleness (server updates between a worker's pull and its push)")
    ax.set_ylabel("share of applied gradients (%)")
    note(ax, f"bars: mean over repeats; {SPREAD_NOTE}"
         + _skipped("no staleness (no servers) for", groups, rows))
    legend(ax, title="group")
    return fig


def staleness_over_time(groups: list[Group]):
    fig, (ax,) = new_figure()
    missing = bands_over_time(
        ax, groups, "pushes", lambda r: float(r.column("pushes", "t").max()),
        # about 20 pushes a bin
        lambda runs, end: int(np.clip(sum(len(r.column("pushes", "t")) for r in runs)
                                      / len(runs) / 20, 5, 60)),
        lambda r, edges: _bin_means(r.column("pushes", "t"), r.column("pushes", "staleness"),
                                    edges))
    if len(missing) == len(groups):
        raise NoData("no server recorded pushes (no parameter servers)")
    ax.set_xlabel("time since job start (s)")
    ax.set_ylabel("staleness of applied gradients (mean per time bin)")
    from_zero(ax)
    note(ax, BAND_NOTE
         + (f"; no pushes for {', '.join(missing)}" if missing else ""))
    legend(ax, title="group")
    return fig


def _bin_means(t: np.ndarray, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    bins = len(edges) - 1
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    counts = np.bincount(index, minlength=bins)
    sums = np.bincount(index, weights=y, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def weight_updates_figure(groups: list[Group]):
    rows = [(g, stats(weight_updates(r) for r in g.runs)) for g in groups]
    rows = [(g, s) for g, s in rows if s is not None]
    if not rows:
        raise NoData("no run recorded its weight updates")
    fig, (ax,) = new_figure()
    bars = ax.bar(range(len(rows)), [s.mean for _, s in rows], 0.6,
                  color=[g.color for g, _ in rows])
    ax.bar_label(bars, [f"{s.mean:,.0f}" for _, s in rows], padding=2, fontsize=8)
    spread(ax, range(len(rows)), [s for _, s in rows])
    group_ticks(ax, [group_name(g) for g, _ in rows])
    ax.set_xlabel("group")
    ax.set_ylabel("weight updates (count, per server shard)")
    from_zero(ax, 1.1)
    note(ax, f"bar: mean over repeats; {SPREAD_NOTE}; without servers one update per step")
    return fig


def push_pull_latency(groups: list[Group]):
    rows = []
    for group in groups:
        push = np.concatenate([latencies_ms(r, "push") for r in group.runs])
        pull = np.concatenate([latencies_ms(r, "pull") for r in group.runs])
        if (push > 0).any() or (pull > 0).any():
            rows.append((group, push, pull))
    if not rows:
        raise NoData("no iteration spent time pushing or pulling")
    fig, axes = new_figure(ncols=2)
    for ax, column, name in ((axes[0], 1, "push (send gradients)"),
                             (axes[1], 2, "pull (fetch parameters)")):
        boxes = ax.boxplot([r[column] for r in rows], positions=range(len(rows)), widths=0.6,
                           showfliers=False, whis=(5, 95), patch_artist=True,
                           medianprops={"color": "black"})
        for patch, (group, *_) in zip(boxes["boxes"], rows, strict=True):
            patch.set(facecolor=group.color, alpha=0.7)
        group_ticks(ax, [group_name(g) for g, *_ in rows])
        ax.set_xlabel("group")
        ax.set_ylabel(f"{name.split()[0]} time per iteration (ms)")
        from_zero(ax)
        ax.set_title(name)
    text = ("box: quartiles and median over all steady iterations of all workers and repeats;"
            " whiskers: 5th-95th percentile. Parameter-server workers start sending each bucket"
            " during backward, so push is the sending time left after backward (what overlap"
            " did not hide), not the full transfer time"
            + _skipped("no push or pull (collectives) for", groups, rows))
    fig.supxlabel(textwrap.fill(text, 120), fontsize=8, color="0.35")
    return fig
