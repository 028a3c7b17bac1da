"""Drawing helpers shared by the figures: one look for bands, error bars, bars and legends.

Figures are built with matplotlib's object API (`Figure`, rendered by the Agg canvas), never
pyplot: headless, and the backend of a caller's interactive session stays as it was.
"""

from __future__ import annotations

import io
import textwrap

import numpy as np
from matplotlib.figure import Figure

from polyrhythm.report.data import Group
from polyrhythm.report.measures import Stats

STYLE = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
DPI = 110
LEGEND_CHARS_PER_INCH = 15  # label characters across an inch at the legend's font size
LEGEND_ENTRY_CHARS = 6  # an entry's marker and padding, in characters


class NoData(Exception):
    """A figure the runs have no data for; its message says why."""


def new_figure(ncols: int = 1, width: float = 8.0, height: float = 4.4) -> tuple[Figure, list]:
    """A figure with a row of axes; its title is the report's (set when it is rendered)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def title(fig: Figure, text: str) -> None:
    fig.suptitle(text, fontsize=11, fontweight="bold")


def note(ax, text: str, width: int = 95) -> None:
    """A grey line under the figure's title: what the reader should know about its data."""
    ax.set_title(textwrap.fill(text, width), fontsize=8, color="0.35")


def legend(ax, title: str | None = None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) > 6:
        figure_legend(ax.figure, handles, labels, title)
    else:
        ax.legend(loc="best", title=title, framealpha=0.85)


def figure_legend(fig: Figure, handles, labels, title: str | None = None,
                  right: bool = False) -> None:
    """One legend for the whole figure: under its axes, or right of them."""
    if right:
        fig.legend(handles, labels, loc="outside right upper", title=title, frameon=False)
    else:  # as many columns as fit across the figure (long labels would be cut off)
        width = fig.get_figwidth() * LEGEND_CHARS_PER_INCH
        fits = int(width // (max(map(len, labels), default=1) + LEGEND_ENTRY_CHARS))
        fig.legend(handles, labels, loc="outside lower center", title=title,
                   ncols=max(1, min(4, len(handles), fits)), frameon=False)


BAND_NOTE = "line: mean over repeats; dark band: ±1 std; light band: min-max"  # of band()


def band(ax, x, columns: dict[str, np.ndarray], group: Group, label: str,
         scale: float = 1.0) -> None:
    """Mean line; dark band ±1 std and light band min-max over repeats (where there are).

    Drawn only where every repeat has data: past the end of the shortest repeat the mean
    would jump from one set of runs to another."""
    x = np.asarray(x, dtype=float)
    columns = {k: np.where(columns["n"] == columns["n"].max(), v, np.nan)
               for k, v in columns.items()}
    mean, std = columns["mean"] * scale, columns["std"] * scale
    ax.plot(x, mean, color=group.color, marker=group.marker, markersize=3.5,
            markevery=max(1, len(x) // 25), linewidth=1.6, label=label)
    if np.nanmax(columns["n"], initial=0) > 1:
        ax.fill_between(x, mean - std, mean + std, color=group.color, alpha=0.25, linewidth=0)
        ax.fill_between(x, columns["min"] * scale, columns["max"] * scale, color=group.color,
                        alpha=0.1, linewidth=0)


def points(ax, x: list[float], values: list[Stats], color: str, marker: str, label: str,
           line: bool = True) -> None:
    """Means (joined by a line), thick bars ±1 std and thin capped bars min-max."""
    mean = np.array([s.mean for s in values])
    ax.plot(x, mean, color=color, marker=marker, markersize=6, linewidth=1.6 if line else 0,
            label=label, zorder=3)
    spread(ax, x, values, color)


def spread(ax, x, values: list[Stats], color: str = "0.15", across: bool = False) -> None:
    """Thick ±1 std and thin capped min-max bars where repeats differ: vertical bars at
    positions x, or (across) horizontal ones at heights x."""
    repeated = [(xi, s) for xi, s in zip(x, values, strict=True) if s.n > 1 and s.max > s.min]
    if not repeated:
        return
    xs = [xi for xi, _ in repeated]
    mean = np.array([s.mean for _, s in repeated])
    at, err = ((mean, xs), "xerr") if across else ((xs, mean), "yerr")
    ax.errorbar(*at, **{err: [mean - [s.min for _, s in repeated],
                              [s.max for _, s in repeated] - mean]},
                fmt="none", ecolor=color, elinewidth=0.8, capsize=4, zorder=4)
    ax.errorbar(*at, **{err: [s.std for _, s in repeated]}, fmt="none", ecolor=color,
                elinewidth=3, alpha=0.6, zorder=4)


def group_ticks(ax, labels: list[str], positions=None) -> None:
    """Group labels on the x axis, slanted when they would collide."""
    positions = range(len(labels)) if positions is None else positions
    long = max(map(len, labels), default=0) * len(labels) > 75
    ax.set_xticks(list(positions), labels, rotation=25 if long else 0,
                  ha="right" if long else "center")
    ax.grid(False, axis="x")


def from_zero(ax, headroom: float = 1.08) -> None:
    """y from 0, with room above the highest value (a flat line would sit on the frame)."""
    high = ax.dataLim.y1 if np.isfinite(ax.dataLim.y1) else 0.0
    ax.set_ylim(0, max(ax.get_ylim()[1], high * headroom) or 1.0)


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
