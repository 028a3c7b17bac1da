"""Compression in a report: bytes per step against validation accuracy, one point per group
(a strategy, what it compressed with and any other field that varies, over its repeats), and
each compressed group beside the uncompressed one it should be read against.

A report has this figure and its table (tables.compression_table) only when one of its runs
compressed its messages. Bytes per step: what every rank sent (point to point, and the payload
it handed to Gloo's own collectives), summed over the ranks, over the workers' steps summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.ticker import EngFormatter, NullFormatter

from polyrhythm.metrics.records import compression_label, compression_section, flatten
from polyrhythm.report.data import Group, Run
from polyrhythm.report.measures import Stats, bytes_per_step, final_accuracy, stats
from polyrhythm.report.plot import NoData, legend, new_figure, note, points, spread
from polyrhythm.report.training import group_name

_MARKERS = "osD^vPX*hp"
# Fields that do not tell a compressed run's uncompressed counterpart: repeats differ in seed.
_NOT_SETTINGS = {"seed", "out"}


@dataclass(frozen=True, eq=False)
class Point:
    """One group: what it compressed with, its bytes per step and final validation accuracy
    (%) over its repeats, and the uncompressed group of the same settings (None if the
    report has none; the group itself if it compressed nothing)."""

    group: Group
    compressor: str
    bytes: Stats | None
    accuracy: Stats | None
    baseline: Group | None

    @property
    def compression(self) -> dict:
        """The first run's summary of its compression ({} if it compressed nothing)."""
        return self.group.runs[0].summary.get("compression") or {}


def compressed(groups: list[Group]) -> bool:
    """Whether any run of the report compressed its messages."""
    return any(_section(r) for g in groups for r in g.runs)


def _section(run: Run) -> dict:
    return compression_section(run.row["config"])


def _settings(run: Run) -> tuple:
    """The run's strategy and config, less what it compressed with and its seed: what it
    shares with the uncompressed run it is compared with."""
    left_out = _NOT_SETTINGS | set(flatten({"compression": _section(run)}))
    return run.row["strategy"], tuple(sorted((k, repr(v)) for k, v in run.config.items()
                                             if k not in left_out))


def compression_points(groups: list[Group]) -> list[Point]:
    """Every group as a point, in the groups' order."""
    uncompressed: dict[tuple, Group] = {}
    for group in groups:
        if not _section(group.runs[0]):
            uncompressed.setdefault(_settings(group.runs[0]), group)
    return [Point(g, compression_label(_section(g.runs[0])),
                  stats(bytes_per_step(r) for r in g.runs),
                  stats(100 * a for r in g.runs if (a := final_accuracy(r)) is not None),
                  uncompressed.get(_settings(g.runs[0]))) for g in groups]


def bytes_vs_accuracy(groups: list[Group]):
    """Final validation accuracy against bytes per step (log), a marker per compressor and,
    where the report holds several strategies, a colour per strategy."""
    every = compression_points(groups)
    shown = [p for p in every if _drawable(p)]
    if not shown:
        raise NoData("no run recorded both its traffic and a final validation accuracy")
    strategies = list(dict.fromkeys(p.group.strategy for p in shown))
    colors = {g.strategy: g.color for g in reversed(groups)}  # each strategy's first group's
    markers = {c: _MARKERS[i % len(_MARKERS)]
               for i, c in enumerate(dict.fromkeys(p.compressor for p in shown))}
    fig, (ax,) = new_figure()
    for p in shown:
        color = colors[p.group.strategy] if len(strategies) > 1 else p.group.color
        points(ax, [p.bytes.mean], [p.accuracy], color, markers[p.compressor],
               group_name(p.group), line=False)
        spread(ax, [p.accuracy.mean], [p.bytes], color, across=True)
    _bytes_axis(ax, [v for p in shown for v in (p.bytes.min, p.bytes.max)])
    ax.set_xlabel("bytes sent per worker step, all ranks (log scale)")
    ax.set_ylabel("final validation accuracy (%)")
    left = [p.group.label for p in every if not _drawable(p)]
    note(ax, "bytes: all ranks' sends (point to point and handed to native collectives) / "
         "all workers' steps; marker: mean over repeats, its shape the compressor"
         + ("; colour: strategy" if len(strategies) > 1 else "")
         + "; thick bars: ±1 std, thin capped bars: min-max over repeats, on both axes"
         + (f"; no traffic or accuracy for {', '.join(left)}" if left else ""))
    legend(ax, title="group")
    return fig


def _drawable(p: Point) -> bool:
    return p.bytes is not None and p.bytes.min > 0 and p.accuracy is not None


def _bytes_axis(ax, values: list[float]) -> None:
    """Log scale over whole decades (so at least two labelled ticks) with room around the
    values, in B, kB, MB."""
    low = np.floor(np.log10(min(values) / 1.5))
    high = np.ceil(np.log10(max(values) * 1.5))
    ax.set_xscale("log")
    ax.set_xlim(10 ** low, 10 ** max(high, low + 1))
    ax.xaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.xaxis.set_minor_formatter(NullFormatter())
