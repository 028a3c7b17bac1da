"""How each run's training set was split across its workers (summary["data"], written by
data/splitters.py shard_stats): per-worker class histograms, and a table of the splits
beside the run-to-run spread they are meant to lower."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from polyrhythm.report.data import Group
from polyrhythm.report.plot import NoData, group_ticks, new_figure, note

MAX_PANELS = 4


def draw_shards(ax, shards: list[dict], heading: str) -> None:
    """One group of bars per worker, a bar per class: its examples of that class."""
    counts = np.array([s["class_counts"] for s in shards])
    workers, classes = counts.shape
    width = 0.85 / classes
    colors = _class_colors(classes)
    for c in range(classes):
        ax.bar(np.arange(workers) - 0.425 + (c + 0.5) * width, counts[:, c], width,
               color=colors[c], label=str(c) if classes <= 20 else None, linewidth=0)
    group_ticks(ax, [f"worker {s['worker']}" + (f"\n+{s['copies']} copies" if s["copies"]
                                                  else "") for s in shards])
    ax.set_ylabel("examples per class")
    ax.set_title(heading, fontsize=9)


def shard_figure(shards: list[dict], heading: str) -> Figure:
    """The figure of one split (`polyrhythm shard --plot`)."""
    fig, (ax,) = new_figure(width=max(6.0, 1.4 * len(shards) + 2), height=3.8)
    draw_shards(ax, shards, heading)
    _class_legend(fig, ax, len(shards[0]["class_counts"]))
    return fig


def shards_figure(groups: list[Group]) -> Figure:
    """The report's: the split of the first run of each group that stored one (a group's
    runs differ only in seed), up to four groups."""
    found = [(g, run.summary["data"]) for g in groups
             for run in g.runs[:1] if run.summary.get("data", {}).get("shards")]
    if not found:
        raise NoData("no run stored how its data was split (runs before polyrhythm 0.3)")
    shown = found[:MAX_PANELS]
    fig = Figure(figsize=(4.2 * len(shown) + 1, 3.8), layout="constrained")
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    for ax, (g, data) in zip(axes, shown, strict=True):
        draw_shards(ax, data["shards"], f"{g.label}\n{data['sharding']}")
    if len(found) > MAX_PANELS:
        note(axes[0], f"the first {MAX_PANELS} of {len(found)} groups")
    _class_legend(fig, axes[-1], len(shown[0][1]["shards"][0]["class_counts"]))
    return fig


def _class_colors(classes: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if classes <= 10 else "tab20" if classes <= 20 else "viridis"]
    return [cmap(c if classes <= 20 else c / max(1, classes - 1)) for c in range(classes)]


def _class_legend(fig: Figure, ax, classes: int) -> None:
    if classes <= 20:
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", title="class", frameon=False)
