"""Figures of the processes' resources over time (CPU, memory, network), servers apart from
workers: per group the mean over the role's processes, then mean and spread over repeats,
drawn at the samples themselves."""

from __future__ import annotations

import textwrap

import numpy as np

from polyrhythm.report.data import Group, Run
from polyrhythm.report.measures import column_stats
from polyrhythm.report.plot import BAND_NOTE, NoData, band, figure_legend, from_zero, new_figure
from polyrhythm.report.training import group_name

ROLES = (("server", "servers"), ("worker", "workers"))


def _cpu(t, columns):
    return t, columns["cpu_percent"]


def _memory(t, columns):
    return t, columns["rss_bytes"] / 2**20


def _network(t, columns):
    """Bytes/s sent and received, from the cumulative counters: the rate between consecutive
    samples, at the middle of the interval (so n samples give n - 1 points)."""
    total = columns["bytes_sent"] + columns["bytes_received"]
    dt = np.diff(t)
    ok = dt > 0
    return ((t[1:] + t[:-1]) / 2)[ok], np.maximum(np.diff(total)[ok] / dt[ok], 0.0)


def _process_curves(run: Run, role: str, value) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (t, value) curve per process of the role that has a point."""
    columns = run.series.get("resources", {})
    if not columns:
        return []
    curves = []
    for rank in np.unique(columns["rank"][columns["role"] == role]):
        keep = (columns["rank"] == rank) & (columns["role"] == role)
        order = np.argsort(columns["t"][keep], kind="stable")
        process = {k: v[keep][order] for k, v in columns.items() if k != "role"}
        t, y = value(process["t"], process)
        if len(t):
            curves.append((t, y))
    return curves


def _aligned(curves) -> tuple[np.ndarray, np.ndarray]:
    """Curves lined up by sample index (every process samples on the same schedule, 0.25 s
    after the start, then once a second, and once at its end), cut to the shortest: each
    point's mean time and its values, one row per curve. No interpolation, so each point
    drawn is a sample that was taken."""
    n = min(len(t) for t, _ in curves)
    return (np.mean([t[:n] for t, _ in curves], axis=0),
            np.vstack([y[:n] for _, y in curves]))


def _role_bands(groups: list[Group], role: str, value):
    """Per group with samples of the role: sample times, stats over repeats of the mean over
    the role's processes, and the samples per process drawn."""
    bands = []
    for group in groups:
        per_run = [_aligned(c) for r in group.runs if (c := _process_curves(r, role, value))]
        if not per_run:
            continue
        t, runs = _aligned([(t, values.mean(axis=0)) for t, values in per_run])
        bands.append((group, t, column_stats(list(runs)), len(t)))
    return bands


def _unit(peak: float) -> tuple[str, float]:
    for name, size in (("MiB/s", 2**20), ("KiB/s", 2**10)):
        if peak >= size:
            return name, size
    return "B/s", 1.0


def _resource_figure(groups: list[Group], ylabel: str, value, rate: bool = False):
    per_role = [(role, plural, _role_bands(groups, role, value)) for role, plural in ROLES]
    if not any(bands for _, _, bands in per_role):
        raise NoData("no process resource samples were recorded")
    peak = max(float(np.nanmax(s["mean"], initial=0)) for *_, bands in per_role
               for _, _, s, _ in bands)
    unit, size = _unit(peak) if rate else ("", 1.0)
    fig, axes = new_figure(ncols=2, width=10.0)
    handles = {}
    for ax, (_role, plural, bands) in zip(axes, per_role, strict=True):
        for group, grid, columns, _ in bands:
            band(ax, grid, columns, group, group_name(group), scale=1 / size)
        ax.set_title(f"{plural} (mean per process)")
        ax.set_xlabel("time since job start (s)")
        ax.set_ylabel(ylabel.format(unit=unit))
        from_zero(ax)
        if not bands:
            ax.text(0.5, 0.5, f"no {plural} in these runs", transform=ax.transAxes,
                    ha="center", va="center", color="0.4")
        handles.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    figure_legend(fig, list(handles.values()), list(handles), title="group", right=True)
    shown = {group.label for *_, bands in per_role for group, *_ in bands}
    missing = [g.label for g in groups if g.label not in shown]
    counts = [samples for *_, bands in per_role for *_, samples in bands]
    text = (f"each process sampled 0.25 s in, then about once a second, and at its end; "
            f"{_span(counts)} points per line{' (rates: between samples)' if rate else ''}, "
            "one marker each (the k-th samples of every process and repeat together); "
            + BAND_NOTE)
    if missing:
        why = "no samples, or fewer than two for a rate" if rate else "no samples"
        text += f"; {why} for: {', '.join(missing)}"
    fig.supxlabel(textwrap.fill(text, 140), fontsize=8, color="0.35")
    return fig


def _span(counts: list[int]) -> str:
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def cpu_over_time(groups: list[Group]):
    return _resource_figure(groups, "CPU (% of one core)", _cpu)


def memory_over_time(groups: list[Group]):
    return _resource_figure(groups, "resident memory (RSS, MiB)", _memory)


def network_over_time(groups: list[Group]):
    return _resource_figure(groups, "sent + received ({unit})", _network, rate=True)
