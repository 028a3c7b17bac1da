"""Figures of the processes' resources over time (CPU, memory, network), servers apart from
workers: per group the mean over the role's processes, then mean and spread over repeats."""

from __future__ import annotations

import textwrap

import numpy as np

from polyrhythm.report.data import Group, Run
from polyrhythm.report.measures import column_stats
from polyrhythm.report.plot import NoData, band, figure_legend, from_zero, new_figure
from polyrhythm.report.training import group_name

ROLES = (("server", "servers"), ("worker", "workers"))
GRID_POINTS = 150


def _cpu(t, columns):
    return t, columns["cpu_percent"]


def _memory(t, columns):
    return t, columns["rss_bytes"] / 2**20


def _network(t, columns):
    """Bytes/s sent and received, from the cumulative counters, between samples."""
    total = columns["bytes_sent"] + columns["bytes_received"]
    dt = np.diff(t)
    ok = dt > 0
    return ((t[1:] + t[:-1]) / 2)[ok], np.maximum(np.diff(total)[ok] / dt[ok], 0.0)


def _process_curves(run: Run, role: str, value) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (t, value) curve per process of the role, with at least two points."""
    columns = run.series.get("resources", {})
    if not columns:
        return []
    curves = []
    for rank in np.unique(columns["rank"][columns["role"] == role]):
        keep = (columns["rank"] == rank) & (columns["role"] == role)
        order = np.argsort(columns["t"][keep], kind="stable")
        process = {k: v[keep][order] for k, v in columns.items() if k != "role"}
        t, y = value(process["t"], process)
        if len(t) > 1:
            curves.append((t, y))
    return curves


def _run_curve(curves, grid: np.ndarray) -> np.ndarray:
    """Mean over processes on the grid, where every process has samples around that time (the
    mean would jump where one process's samples end); NaN elsewhere."""
    start, end = max(t[0] for t, _ in curves), min(t[-1] for t, _ in curves)
    mean = np.mean([np.interp(grid, t, y) for t, y in curves], axis=0)
    return np.where((grid >= start) & (grid <= end), mean, np.nan)


def _role_bands(groups: list[Group], role: str, value):
    """Per group with samples of the role: grid times and stats over repeats."""
    bands = []
    for group in groups:
        per_run = [c for r in group.runs if (c := _process_curves(r, role, value))]
        if not per_run:
            continue
        times = [t for curves in per_run for t, _ in curves]
        grid = np.linspace(min(t[0] for t in times), max(t[-1] for t in times), GRID_POINTS)
        bands.append((group, grid, column_stats([_run_curve(c, grid) for c in per_run])))
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
               for *_, s in bands)
    unit, size = _unit(peak) if rate else ("", 1.0)
    fig, axes = new_figure(ncols=2, width=10.0)
    handles = {}
    for ax, (_role, plural, bands) in zip(axes, per_role, strict=True):
        for group, grid, columns in bands:
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
    text = "line: mean over repeats; dark band: ±1 std; light band: min-max"
    if missing:
        text += f"; fewer than two samples per process for: {', '.join(missing)}"
    fig.supxlabel(textwrap.fill(text, 140), fontsize=8, color="0.35")
    return fig


def cpu_over_time(groups: list[Group]):
    return _resource_figure(groups, "CPU (% of one core)", _cpu)


def memory_over_time(groups: list[Group]):
    return _resource_figure(groups, "resident memory (RSS, MiB)", _memory)


def network_over_time(groups: list[Group]):
    return _resource_figure(groups, "sent + received ({unit})", _network, rate=True)
