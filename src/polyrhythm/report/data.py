"""The runs a report covers: read from the store, labelled, and grouped into repeats.

A group is every completed run with the same label: the strategy plus each config field
that differs between runs of one strategy (the seed aside), so repeats share a label.
A family is a group's label without the worker count: the runs of one scaling curve.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from polyrhythm.errors import ConfigError, StoreError
from polyrhythm.metrics.records import config_fields
from polyrhythm.metrics.store import SERIES, RunStore
from polyrhythm.report.summary import readable

# Fields that never tell groups apart: repeats differ in seed; the strategy leads the label.
_NOT_LABELS = {"seed", "out", "strategy"}
_SHORT = {"workers": "N", "servers": "S"}
_FIRST = ("workers", "servers")
_FOLLOW_FIRST = ("batch_size", "hosts", "servers", "worker_delay_s")
# matplotlib's tab10 palette: distinct colours for up to ten groups (then markers differ).
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class Run:
    """One run's row, its parsed config and summary, and (once completed) its series."""

    row: dict
    config: dict
    summary: dict
    epochs: list[dict] = field(default_factory=list)
    series: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    label: str = ""
    family: str = ""

    @property
    def run_id(self) -> str:
        return self.row["run_id"]

    @property
    def completed(self) -> bool:
        return self.row["status"] == "completed"

    @property
    def workers(self) -> int:
        return int(self.row["workers"])

    def column(self, table: str, name: str) -> np.ndarray:
        """One column of an event series; empty where the run has none."""
        return self.series.get(table, {}).get(name, np.zeros(0))


@dataclass
class Group:
    """Repeats: completed runs that share a label."""

    label: str
    family: str
    strategy: str
    workers: int
    runs: list[Run]
    color: str = "C0"
    marker: str = "o"


def load_runs(store_path: str | Path, run_ids: list[str]) -> list[Run]:
    """The runs, in the order given (duplicates dropped), with the series of completed ones."""
    path = Path(store_path)
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        raise ConfigError("no run ids given for the report")
    if not path.is_file():
        raise StoreError(f"no run store at {str(path)!r}")
    store = RunStore(path)
    rows = {r["run_id"]: r for r in store.runs()}
    unknown = [i for i in ids if i not in rows]
    if unknown:
        raise StoreError(f"unknown run id{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)} in {str(path)!r}")
    runs = [Run(r, _toml(r["config"], r["run_id"]), readable(_json(r["summary"])))
            for r in map(rows.__getitem__, ids)]
    if not any(r.completed for r in runs):
        statuses = ", ".join(f"{r.run_id}: {r.row['status']}" for r in runs)
        raise StoreError(f"none of the {len(runs)} runs completed, so there is nothing to "
                         f"plot ({statuses})")
    for run in runs:
        if run.completed:
            run.epochs = store.epochs(run.run_id)
            run.series = {table: _columns(store.series(table, run.run_id), SERIES[table])
                          for table in SERIES}
    _label(runs)
    return runs


def _toml(text: str | None, run_id: str) -> dict:
    """The stored config as flat fields (sectioned or, from polyrhythm 0.1, flat)."""
    try:
        return config_fields(text or "", run_id)
    except StoreError:  # not TOML: the report shows the run without its settings
        return {}


def _json(text: str | None) -> dict:
    try:
        value = json.loads(text) if text else {}
    except (ValueError, RecursionError):  # not JSON (or nested too deep)
        return {}
    return value if isinstance(value, dict) else {}


TEXT_COLUMNS = ("role", "cause")  # of the series: kept as they are; host: NULL as NaN


def _columns(rows: list[dict], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not rows:
        return {}
    return {n: np.array([r[n] for r in rows], dtype=object if n in TEXT_COLUMNS else float)
            for n in names}


def _label(runs: list[Run]) -> None:
    """Label every run (failed ones too) by the fields that vary within a strategy, less those
    that follow the worker count (see _followers)."""
    by_strategy: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.completed:
            by_strategy[run.row["strategy"]].append(run)
    varying = set()
    for members in by_strategy.values():
        for key in set().union(*(r.config for r in members)) - _NOT_LABELS:
            if len({_text(r.config.get(key)) for r in members}) > 1:
                varying.add(key)
    completed = [r for members in by_strategy.values() for r in members]
    varying -= _followers(completed, varying)
    keys = [k for k in _FIRST if k in varying] + sorted(varying - set(_FIRST))
    for run in runs:
        config = _fields(run)
        parts = [(k, f"{_SHORT.get(k, k)}={_text(config[k])}") for k in keys if k in config]
        run.label = " ".join([run.row["strategy"], *(p for _, p in parts)])
        run.family = " ".join([run.row["strategy"], *(p for k, p in parts if k != "workers")])


def _fields(run: Run) -> dict:
    return {**run.config, "workers": run.row["workers"], "servers": run.row["servers"]}


def _followers(runs: list[Run], varying: set[str]) -> set[str]:
    """The varying fields that follow the worker count: no two runs with the same strategy,
    workers and other (non-following) fields differ in them. Sweeps over workers set them
    with it (batch_size from worker_batch_size, hosts from workers_per_host, servers on a
    collocated cluster, a linked axis's worker_delay_s), so they stay out of labels, and
    a scaling curve joins the points. Sizes are tried first: of two fields that determine
    each other (servers and placement), the size follows, the choice stays."""
    if "workers" not in varying:
        return set()
    followers: set[str] = set()
    for key in ([k for k in _FOLLOW_FIRST if k in varying]
                + sorted(varying - {*_FOLLOW_FIRST, "workers"})):
        rest = sorted(varying - followers - {key, "workers"})
        seen: dict[tuple, str] = {}
        for run in runs:
            config = _fields(run)
            ident = (run.row["strategy"], config["workers"], *(_text(config.get(k)) for k in rest))
            if seen.setdefault(ident, _text(config.get(key))) != _text(config.get(key)):
                break
        else:
            followers.add(key)
    return followers


def _natural(text: str) -> list:
    """Text with its numbers as numbers, so latency=10ms sorts before latency=100ms."""
    return [(0, float(part), "") if i % 2 else (1, 0.0, part)
            for i, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", text))]


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return str(value)


def group_runs(runs: list[Run]) -> list[Group]:
    """Completed runs by label: strategies in order of first appearance, then by workers."""
    members: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.completed:
            members[run.label].append(run)
    order = list(dict.fromkeys(r.row["strategy"] for r in runs if r.completed))
    groups = [Group(label, rs[0].family, rs[0].row["strategy"], rs[0].workers, rs)
              for label, rs in members.items()]
    groups.sort(key=lambda g: (order.index(g.strategy), _natural(g.family), g.workers,
                               _natural(g.label)))
    for i, group in enumerate(groups):
        group.color = _COLORS[i % len(_COLORS)]
        group.marker = "osD^vPX*hp"[i % 10 if len(groups) <= 10 else i // len(_COLORS) % 10]
    return groups
