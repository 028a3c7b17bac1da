"""Reading a sweep: every combination of some run settings, times a number of seeds.

A sweep file is TOML:

    name = "sync-vs-async"   # default: the file's name; the sweep id is its slug, or --id
    description = "..."      # optional; shown after the name in the report's title
    repeats = 2              # optional, default 1: repeat r runs with seed = base seed + r
    [base]                   # settings every run shares (flat keys, as in a `train` config)
    epochs = 2
    workers = 4
    [grid]                   # a list of values per field: every combination is one point
    strategy = ["bsp", "asp", "ssp"]
    batch_size = [32, 64]

A sweep may run a user's training script instead of polyrhythm train's job: `script =
"train.py"` (relative to the sweep file's folder) and optionally `args = ["--steps", "40"]`,
the arguments every run passes it; its model and data are the script's, so the grid varies
the job's settings (strategy, workers, servers, ...).

Grid values override base values. A list-valued field takes a list of lists in the grid
(`worker_delay_s = [[], [0, 0, 0, 0.2]]`). A field a point does not read is dropped from that point
rather than making it invalid: other strategies' (data sets', models') parameters (`tau` for
`bsp`), and `servers` and `bucket_kb` for strategies without servers (`bucket_kb` also for
those that push whole gradients). Points that become identical are run once, so strategy = ["bsp",
"localsgd"] with tau = [2, 8] gives three points. A field no point reads is an error. Every
run is validated before the first one starts.

A point's key is its fields as canonical JSON: the sweep tables of the store (sweep/store.py)
remember which (point, repeat) completed, so a sweep run again (sweep/runner.py) finishes
where it stopped.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w

from polyrhythm.config import (
    COMPONENTS,
    RunConfig,
    flat_keys,
    load_toml,
    make_config,
    owners,
    unread_fields,
)
from polyrhythm.errors import ConfigError
from polyrhythm.files import checked_name
from polyrhythm.metrics.records import STORE_NAME, flatten

SWEEP_KEYS = ("name", "description", "repeats", "base", "grid", "script", "args")
COMPARE_STRATEGIES = ("bsp", "asp", "ssp", "allreduce", "localsgd")
COMPARE_EPOCHS = 2
_DEFAULT_STRATEGY = COMPONENTS["strategy"].default


@dataclass(frozen=True)
class Point:
    """One combination of the grid: the RunConfig fields of its runs (but seed and out)."""

    fields: dict[str, Any]
    label: str

    @property
    def key(self) -> str:
        return json.dumps(self.fields, sort_keys=True, separators=(",", ":"))

    @property
    def base_seed(self) -> int:
        return self.fields.get("seed", 0)


@dataclass(frozen=True)
class PlannedRun:
    point: Point
    repeat: int
    config: RunConfig

    @property
    def label(self) -> str:
        return f"{self.point.label} seed={self.config.seed}"


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep: its points and repeats, and where its runs are stored."""

    name: str
    sweep_id: str
    points: list[Point]
    repeats: int
    out: Path
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    description: str = ""
    kind: str = "sweep"  # sweep | compare
    script: str | None = None  # a user's training script each run runs, or polyrhythm train's
    args: list[str] = field(default_factory=list)  # the script's arguments

    @property
    def store_path(self) -> Path:
        return self.out / STORE_NAME

    @property
    def dir(self) -> Path:
        """Where the sweep's file and report are written."""
        return self.out / "sweeps" / self.sweep_id

    def plan(self) -> list[PlannedRun]:
        """Every run, validated: a bad point is a one-line ConfigError naming it."""
        runs = []
        for point in self.points:
            for repeat in range(self.repeats):
                values = {**point.fields, "seed": point.base_seed + repeat, "out": str(self.out)}
                try:
                    config = make_config(values)
                except ConfigError as exc:
                    raise ConfigError(f"sweep {self.name!r}, point {point.label}: {exc}"
                                      ) from None
                runs.append(PlannedRun(point, repeat, config))
        return runs

    def to_toml(self) -> str:
        """The sweep as a file `polyrhythm sweep` reads back (with this sweep's id as name)."""
        data: dict[str, Any] = {"name": self.sweep_id}
        if self.description:
            data["description"] = self.description
        if self.script is not None:
            data |= {"script": self.script, "args": self.args}
        data |= {"repeats": self.repeats, "base": {**self.base, "out": str(self.out)},
                 "grid": self.grid}
        return tomli_w.dumps(data)


def load_sweep(path: str | Path, *, sweep_id: str | None = None,
               out: str | None = None) -> Sweep:
    """Read and check a sweep file (structure and every point) without running anything."""
    data = load_toml(path)
    return parse_sweep(data, default_name=Path(path).stem, sweep_id=sweep_id, out=out,
                       folder=Path(path).parent)


def parse_sweep(data: dict[str, Any], *, default_name: str = "sweep",
                sweep_id: str | None = None, out: str | None = None,
                kind: str = "sweep", folder: Path = Path(".")) -> Sweep:
    """A Sweep from the contents of a sweep file (in `folder`, which a relative script path
    starts from); ConfigError (one line) if anything is off."""
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in the sweep file; it holds "
                          f"{', '.join(SWEEP_KEYS)}")
    name = data.get("name", default_name)
    description = data.get("description", "")
    repeats = data.get("repeats", 1)
    base = data.get("base", {})
    grid = data.get("grid", {})
    _expect(isinstance(name, str) and name.strip() != "", "name must be a non-empty string")
    _expect(isinstance(description, str), "description must be a string")
    _expect(type(repeats) is int and repeats >= 1,
            f"repeats must be a whole number of at least 1, got {repeats!r}")
    _expect(isinstance(base, dict), "base must be a table ([base]) of run config fields")
    _expect(isinstance(grid, dict), "grid must be a table ([grid]) of lists")
    script, args = data.get("script"), data.get("args", [])
    _expect(script is None or (isinstance(script, str) and script.strip() != ""),
            "script must be a path to a training script")
    _expect(isinstance(args, list) and all(isinstance(a, str) for a in args),
            'args must be a list of strings, e.g. ["--steps", "40"]')
    _expect(script is not None or "args" not in data, "args is given without a script")
    if script is not None:
        script = str(folder / script) if not Path(script).is_absolute() else script
        _expect(Path(script).is_file(), f"no script {script!r}")
    keys = flat_keys()
    base = flatten(base)  # a base in sections ([base.strategy], ...) as flat keys
    _check_fields(base, "base", keys)
    _check_plain(base, "base")
    _check_plain(grid, "grid")
    _expect(grid != {}, "the grid is empty: give [grid] at least one field with a list of "
                        "values")
    _expect(isinstance(base.get("out", ""), str), "base.out must be a string")
    varied: list[str] = []
    for key, values in grid.items():
        linked = isinstance(values, list) and values != [] and all(
            isinstance(v, dict) for v in values)
        _expect(key in keys or linked,
                f"unknown field {key!r} in [grid]; fields are those of `polyrhythm train` with "
                "underscores (or a list of tables, each setting several fields together)")
        _expect(isinstance(values, list), f"grid.{key} must be a list of values, got "
                                          f"{values!r}")
        _expect(values != [], f"grid.{key} is empty")
        listed = keys.get(key) is not None and keys[key].kind is list
        _expect(not listed or all(isinstance(v, list) for v in values),
                f"grid.{key} takes a list of lists (one list per point), e.g. [[], [0.1]]")
        for table in values if linked else []:
            _check_fields(table, f"grid.{key}", keys)
        for f in _axis_fields(key, values, keys):
            _expect(f not in varied, f"{f} is set by two grid entries")
            _expect(f != "out", "out cannot vary in the grid: a sweep is stored in one place")
            varied.append(f)
    _check_size(grid, repeats)
    sweep_id = check_sweep_id(sweep_id) if sweep_id is not None else slug(name)
    base = dict(base)
    out_dir = Path(out if out is not None else base.pop("out", "runs"))
    base.pop("out", None)
    sweep = Sweep(name=name, sweep_id=sweep_id, points=expand_grid(base, grid),
                  repeats=repeats, out=out_dir, base=base, grid=grid,
                  description=description, kind=kind, script=script, args=list(args))
    sweep.plan()  # every point valid before anything runs
    return sweep


# The runs a sweep may plan: every one is validated before the first starts, and listed by
# --dry-run, so a grid of 10^12 combinations would never answer (nor fit in memory).
MAX_SWEEP_RUNS = 10_000


def _check_size(grid: dict[str, list], repeats: int) -> None:
    """The grid's combinations times the repeats, at most MAX_SWEEP_RUNS: counted from the
    lists' lengths, before a single combination is made."""
    combinations = math.prod(len(values) for values in grid.values())
    _expect(combinations * repeats <= MAX_SWEEP_RUNS,
            f"the grid's {combinations:,} combination{'s' * (combinations != 1)} x "
            f"{repeats:,} repeat{'s' * (repeats != 1)} are more than the "
            f"{MAX_SWEEP_RUNS:,} runs a sweep may plan: split it into smaller sweeps")


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_fields(table: dict, section: str, keys: dict) -> None:
    for key in table:
        if key not in keys:
            raise ConfigError(f"unknown field {key!r} in [{section}]; fields are those of "
                              "`polyrhythm train` with underscores")


INT_RANGE = 2**63  # TOML's integers: signed 64-bit


def _check_plain(value, where: str) -> None:
    """Every value a sweep file gives is a run setting's kind of value (a point's key is
    its fields as JSON): no dates or times, no integers beyond 64 bits."""
    if isinstance(value, dict):
        for k, v in value.items():
            # A key with a line break or control character is shown quoted: the error
            # stays one line.
            _check_plain(v, f"{where}.{k if str(k).isprintable() else repr(k)}")
    elif isinstance(value, list):
        for v in value:
            _check_plain(v, where)
    elif type(value) is int:
        _expect(-INT_RANGE <= value < INT_RANGE, f"{where}: an integer beyond 64 bits is "
                "no run setting")
    else:
        _expect(isinstance(value, str | bool | float), f"{where}: a "
                f"{type(value).__name__} value is no run setting")


def slug(name: str) -> str:
    """The sweep id a name gives: lower case, runs of other characters as one '-'."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not s:
        raise ConfigError(f"sweep name {name!r} gives an empty id; give --id")
    return s


def check_sweep_id(sweep_id: str) -> str:
    """A sweep id names its folder (<out>/sweeps/<id>, <out>/reports/<id>): one name."""
    return checked_name(sweep_id, "sweep id", ConfigError)


def expand_grid(base: dict[str, Any], grid: dict[str, list]) -> list[Point]:
    """Every combination of the grid over base, in grid order; fields a point's strategy does
    not read are dropped from it and identical points are kept once.

    A grid entry that is a RunConfig field takes a list of values; any other entry is a
    linked axis, a list of tables whose fields change together.
    """
    names, keys = list(grid), flat_keys()
    varied = [f for n in names for f in _axis_fields(n, grid[n], keys)]
    points: dict[str, Point] = {}
    read: set[str] = set()
    for values in itertools.product(*(grid[n] for n in names)):
        fields = dict(base)
        for name, value in zip(names, values, strict=True):
            fields |= value if name not in keys else {name: value}
        unread = unread_fields(fields)
        read |= set(fields) - unread
        fields = {k: v for k, v in fields.items() if k not in unread}
        point = Point(fields, _label(fields, varied))
        points.setdefault(point.key, point)
    never = sorted((set(base) | set(varied)) - read)
    if never:
        section = owners().get(never[0], "strategy")
        kind = COMPONENTS.get(section, COMPONENTS["strategy"])
        named = sorted({str(p.fields.get(kind.name_key, kind.default))
                        for p in points.values()})
        kinds = {"strategy": "strategies", "data": "data sets", "model": "models"}
        raise ConfigError(f"{never[0]} is read by none of this sweep's "
                          f"{kinds.get(section, 'strategies')} ({', '.join(named)})")
    return list(points.values())


def _axis_fields(name: str, values: list, keys: dict) -> list[str]:
    """The fields a grid entry varies: itself, or those of a linked axis' tables."""
    if name in keys:  # a field (flat_keys()); else a linked axis
        return [name]
    return list(dict.fromkeys(k for table in values for k in table))


def _label(fields: dict[str, Any], varied: list[str]) -> str:
    """The strategy, then the point's values of the other fields the grid varies."""
    parts = [str(fields.get("strategy", _DEFAULT_STRATEGY))]
    parts += [f"{n}={_show(fields[n])}" for n in varied if n != "strategy" and n in fields]
    return " ".join(parts)


def _show(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else str(value)


def compare_sweep(base: dict[str, Any], strategies: list[str], *, repeats: int = 1,
                  sweep_id: str | None = None) -> Sweep:
    """`polyrhythm compare`: a sweep over strategies sharing one base config."""
    _expect(strategies != [], "--strategies is empty")
    base = {"epochs": COMPARE_EPOCHS, **base}
    base.pop("strategy", None)  # the grid gives it
    sweep_id = sweep_id or f"compare-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    data = {"name": sweep_id, "repeats": repeats, "base": base,
            "grid": {"strategy": list(dict.fromkeys(strategies))},
            "description": f"{', '.join(strategies)} on "
                           f"{base.get('dataset', COMPONENTS['data'].default)}"}
    return parse_sweep(data, sweep_id=sweep_id, kind="compare")
