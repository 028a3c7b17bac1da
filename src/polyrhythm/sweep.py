"""Sweeps: every combination of some RunConfig fields, times a number of seeds, resumable.

A sweep file is TOML:

    name = "sync-vs-async"   # default: the file's name; the sweep id is its slug, or --id
    description = "..."      # optional; shown after the name in the report's title
    repeats = 2              # optional, default 1: repeat r runs with seed = base seed + r
    [base]                   # RunConfig fields every run shares (as in a `train` config file)
    epochs = 2
    workers = 4
    [grid]                   # a list of values per field: every combination is one point
    strategy = ["bsp", "asp", "ssp"]
    batch_size = [32, 64]

Grid values override base values. A list-valued field takes a list of lists in the grid
(`worker_delay_s = [[], [0.2]]`). A field a point's strategy does not read is dropped from
that point rather than making it invalid: other strategies' parameters (`tau` for `bsp`),
and `servers` and `bucket_kb` for strategies without servers (`bucket_kb` also for those that
push whole gradients). Points that become identical are run once, so strategy = ["bsp",
"localsgd"] with tau = [2, 8] gives three points. A field no point reads is an error. Every
run is validated before the first one starts.

Runs go one after another through `polyrhythm.train` into the run store `<out>/polyrhythm.db`,
which also holds two tables of this module: `sweeps` (id, name, kind, the current plan) and
`sweep_runs` (sweep_id, point_key, repeat, run_id, status, error). A point's key is its
fields as canonical JSON. Running a sweep again skips the (point, repeat) pairs whose run
completed and runs the failed and missing ones, so a sweep that was stopped in any way
finishes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import tomli_w

from polyrhythm.config import RunConfig, load_toml, make_config, unread_fields
from polyrhythm.errors import ConfigError, PolyrhythmError, RunFailed, StoreError
from polyrhythm.metrics.store import RunStore
from polyrhythm.records import STORE_NAME

SWEEP_KEYS = ("name", "description", "repeats", "base", "grid")
COMPARE_STRATEGIES = ("bsp", "asp", "ssp", "allreduce", "localsgd")
COMPARE_EPOCHS = 2
_DEFAULT_STRATEGY = RunConfig.model_fields["strategy"].default
_LIST_FIELDS = {name for name, f in RunConfig.model_fields.items()
                if str(f.annotation).startswith("list[")}


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
        data |= {"repeats": self.repeats, "base": {**self.base, "out": str(self.out)},
                 "grid": self.grid}
        return tomli_w.dumps(data)


# --- reading a sweep ----------------------------------------------------------------------

def load_sweep(path: str | Path, *, sweep_id: str | None = None,
               out: str | None = None) -> Sweep:
    """Read and check a sweep file (structure and every point) without running anything."""
    data = load_toml(path)
    return parse_sweep(data, default_name=Path(path).stem, sweep_id=sweep_id, out=out)


def parse_sweep(data: dict[str, Any], *, default_name: str = "sweep",
                sweep_id: str | None = None, out: str | None = None,
                kind: str = "sweep") -> Sweep:
    """A Sweep from the contents of a sweep file; ConfigError (one line) if anything is off."""
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
    _check_fields(base, "base")
    _expect(grid != {}, "the grid is empty: give [grid] at least one field with a list of "
                        "values")
    _expect(isinstance(base.get("out", ""), str), "base.out must be a string")
    varied: list[str] = []
    for key, values in grid.items():
        linked = isinstance(values, list) and values != [] and all(
            isinstance(v, dict) for v in values)
        _expect(key in RunConfig.model_fields or linked,
                f"unknown field {key!r} in [grid]; fields are those of `polyrhythm train` with "
                "underscores (or a list of tables, each setting several fields together)")
        _expect(isinstance(values, list), f"grid.{key} must be a list of values, got "
                                          f"{values!r}")
        _expect(values != [], f"grid.{key} is empty")
        _expect(key not in _LIST_FIELDS or all(isinstance(v, list) for v in values),
                f"grid.{key} takes a list of lists (one list per point), e.g. [[], [0.1]]")
        for table in values if linked else []:
            _check_fields(table, f"grid.{key}")
        for f in _axis_fields(key, values):
            _expect(f not in varied, f"{f} is set by two grid entries")
            _expect(f != "out", "out cannot vary in the grid: a sweep is stored in one place")
            varied.append(f)
    sweep_id = check_sweep_id(sweep_id) if sweep_id is not None else slug(name)
    base = dict(base)
    out_dir = Path(out if out is not None else base.pop("out", "runs"))
    base.pop("out", None)
    sweep = Sweep(name=name, sweep_id=sweep_id, points=expand_grid(base, grid),
                  repeats=repeats, out=out_dir, base=base, grid=grid,
                  description=description, kind=kind)
    sweep.plan()  # every point valid before anything runs
    return sweep


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_fields(table: dict, section: str) -> None:
    for key in table:
        if key not in RunConfig.model_fields:
            raise ConfigError(f"unknown field {key!r} in [{section}]; fields are those of "
                              "`polyrhythm train` with underscores")


def slug(name: str) -> str:
    """The sweep id a name gives: lower case, runs of other characters as one '-'."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not s:
        raise ConfigError(f"sweep name {name!r} gives an empty id; give --id")
    return s


def check_sweep_id(sweep_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", sweep_id):
        raise ConfigError(f"sweep id {sweep_id!r} must be letters, digits, '.', '_' and '-'")
    return sweep_id


def expand_grid(base: dict[str, Any], grid: dict[str, list]) -> list[Point]:
    """Every combination of the grid over base, in grid order; fields a point's strategy does
    not read are dropped from it and identical points are kept once.

    A grid entry that is a RunConfig field takes a list of values; any other entry is a
    linked axis, a list of tables whose fields change together.
    """
    names = list(grid)
    varied = [f for n in names for f in _axis_fields(n, grid[n])]
    points: dict[str, Point] = {}
    read: set[str] = set()
    for values in itertools.product(*(grid[n] for n in names)):
        fields = dict(base)
        for name, value in zip(names, values, strict=True):
            fields |= value if name not in RunConfig.model_fields else {name: value}
        unread = unread_fields(fields)
        read |= set(fields) - unread
        fields = {k: v for k, v in fields.items() if k not in unread}
        point = Point(fields, _label(fields, varied))
        points.setdefault(point.key, point)
    never = sorted((set(base) | set(varied)) - read)
    if never:
        strategies = sorted({p.fields.get("strategy", _DEFAULT_STRATEGY)
                             for p in points.values()})
        raise ConfigError(f"{never[0]} is read by none of this sweep's strategies "
                          f"({', '.join(strategies)})")
    return list(points.values())


def _axis_fields(name: str, values: list) -> list[str]:
    """The fields a grid entry varies: itself, or those of a linked axis' tables."""
    if name in RunConfig.model_fields:
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
                           f"{base.get('dataset', RunConfig.model_fields['dataset'].default)}"}
    return parse_sweep(data, sweep_id=sweep_id, kind="compare")


# --- the sweep tables --------------------------------------------------------------------

_SWEEP_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,               -- sweep | compare
    description TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,            -- last started
    plan TEXT NOT NULL                -- JSON [[point_key, repeat], ...] of the last start
);
CREATE TABLE IF NOT EXISTS sweep_runs (
    sweep_id TEXT NOT NULL,
    point_key TEXT NOT NULL,          -- the point's fields, canonical JSON
    repeat INTEGER NOT NULL,          -- seed = the point's seed + repeat
    run_id TEXT,                      -- null until known (and for runs that failed to start)
    status TEXT NOT NULL,             -- running | completed | failed
    error TEXT,
    updated TEXT NOT NULL,
    PRIMARY KEY (sweep_id, point_key, repeat)
);
"""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class SweepStore(RunStore):
    """The run store with the sweep tables, which it creates on opening; opened on every call."""

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        RunStore._migrate(conn)
        conn.executescript(_SWEEP_SCHEMA)

    def begin(self, sweep: Sweep, plan: list[PlannedRun]) -> None:
        keys = json.dumps([[r.point.key, r.repeat] for r in plan])
        now = _now()
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO sweeps VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(sweep_id) DO UPDATE"
                " SET name = excluded.name, kind = excluded.kind, description ="
                " excluded.description, updated = excluded.updated, plan = excluded.plan",
                (sweep.sweep_id, sweep.name, sweep.kind, sweep.description, now, now, keys))

    def mark(self, sweep_id: str, run: PlannedRun, status: str, run_id: str | None = None,
             error: str | None = None) -> None:
        with self._connect() as conn:
            conn.execute("INSERT OR REPLACE INTO sweep_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (sweep_id, run.point.key, run.repeat, run_id, status, error, _now()))

    def rows(self, sweep_id: str) -> list[dict]:
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(
                "SELECT * FROM sweep_runs WHERE sweep_id = ? ORDER BY updated", (sweep_id,))]

    def completed(self, sweep_id: str) -> dict[tuple[str, int], str]:
        """(point_key, repeat) -> run_id of the runs that completed and are still stored."""
        if not self.path.exists():
            return {}
        stored = {r["run_id"] for r in self.runs() if r["status"] == "completed"}
        return {(r["point_key"], r["repeat"]): r["run_id"] for r in self.rows(sweep_id)
                if r["status"] == "completed" and r["run_id"] in stored}

    def sweeps(self) -> list[dict]:
        """Every sweep, the last started first."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(
                "SELECT * FROM sweeps ORDER BY updated DESC, rowid DESC")]

    def sweep(self, sweep_id: str) -> dict:
        """The sweep's row; ConfigError naming the known ids if there is none."""
        rows = self.sweeps()
        for row in rows:
            if row["sweep_id"] == sweep_id:
                return row
        known = ", ".join(r["sweep_id"] for r in rows) or "none"
        raise ConfigError(f"unknown sweep id {sweep_id!r} in {str(self.path)!r} (known: "
                          f"{known})")

    def run_ids(self, sweep_id: str) -> list[str]:
        """The completed runs of the sweep's last plan, in plan order."""
        done = self.completed(sweep_id)
        plan = json.loads(self.sweep(sweep_id)["plan"])
        return [done[(key, repeat)] for key, repeat in plan if (key, repeat) in done]


# --- running a sweep ---------------------------------------------------------------------

@dataclass
class Outcome:
    """What a sweep run did; `failures` are (run label, one-line error)."""

    sweep: Sweep
    plan: list[PlannedRun]
    earlier: int = 0
    ran: int = 0
    run_ids: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    report: Path | None = None
    report_note: str | None = None

    @property
    def completed(self) -> int:
        return len(self.run_ids)


def run_sweep(sweep: Sweep, *, train: Callable[..., dict] | None = None,
              stream: TextIO | None = None) -> Outcome:
    """Run the sweep's missing runs one after another. A failing run does not stop the
    others; Ctrl-C or SIGTERM stops the sweep (KeyboardInterrupt) with the run in progress
    recorded as failed, to be run again when the sweep is."""
    from polyrhythm.launch.local import signal_handlers

    if train is None:
        from polyrhythm.api import train
    plan = sweep.plan()
    store = SweepStore(sweep.store_path)
    store.begin(sweep, plan)
    _write_sweep_file(sweep)
    done = store.completed(sweep.sweep_id)
    todo = [r for r in plan if (r.point.key, r.repeat) not in done]
    outcome = Outcome(sweep, plan, earlier=len(plan) - len(todo))
    progress = SweepProgress(len(plan), stream or sys.stderr)
    progress.note(f"sweep {sweep.sweep_id}: {len(plan)} runs, "
                  f"{outcome.earlier} completed earlier, {len(todo)} to run")
    stop = _Stop()
    with signal_handlers(sigint=stop, sigterm=stop):
        for run in todo:
            index = plan.index(run) + 1
            store.mark(sweep.sweep_id, run, "running")
            progress.start(index, run.label)
            started = time.monotonic()
            try:
                summary = train(run.config)
            except BaseException as exc:
                interrupted = stop.seen or isinstance(exc, KeyboardInterrupt) or (
                    isinstance(exc, RunFailed) and exc.interrupted)
                if not interrupted and not isinstance(exc, PolyrhythmError):
                    progress.finish(index, run.label, f"failed: {type(exc).__name__}")
                    raise  # a bug: say so with the traceback
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                store.mark(sweep.sweep_id, run, "failed", getattr(exc, "run_id", None), error)
                progress.finish(index, run.label, "interrupted" if interrupted
                                else f"failed: {error}")
                if interrupted:
                    progress.note(f"sweep {sweep.sweep_id} stopped; the same command finishes "
                                  "the runs left")
                    raise KeyboardInterrupt from None
                outcome.failures.append((run.label, error))
            else:
                store.mark(sweep.sweep_id, run, "completed", summary["run_id"])
                progress.finish(index, run.label, f"{summary['final_val_accuracy']:.3f} acc, "
                                f"{time.monotonic() - started:.1f} s")
            outcome.ran += 1
    outcome.run_ids = store.run_ids(sweep.sweep_id)
    return outcome


class _Stop:
    """A SIGINT/SIGTERM handler that remembers it was called and stops what runs."""

    seen = False

    def __call__(self, signum, frame) -> None:
        self.seen = True
        raise KeyboardInterrupt


def _write_sweep_file(sweep: Sweep) -> None:
    try:
        sweep.dir.mkdir(parents=True, exist_ok=True)
        (sweep.dir / "sweep.toml").write_text(sweep.to_toml())
    except OSError as exc:
        raise StoreError(f"cannot write {str(sweep.dir)!r}: {exc.strerror}") from None


class SweepProgress:
    """One line per finished run on the stream; on a terminal also a live bar meanwhile."""

    BAR = 20

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.live = stream.isatty()
        self._ticker: threading.Thread | None = None
        self._stopped = threading.Event()

    def note(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, index: int, label: str) -> None:
        if not self.live:
            return
        self._stopped.clear()
        began = time.monotonic()
        filled = self.BAR * (index - 1) // self.total
        bar = "#" * filled + "." * (self.BAR - filled)
        width = shutil.get_terminal_size().columns - 1  # a wrapped line would not redraw

        def tick() -> None:
            while True:
                line = f"[{index}/{self.total}] [{bar}] {time.monotonic() - began:4.0f} s  {label}"
                self.stream.write(f"\r\x1b[2K{line[:width]}")
                self.stream.flush()
                if self._stopped.wait(0.5):
                    return

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def finish(self, index: int, label: str, text: str) -> None:
        if self._ticker is not None:
            self._stopped.set()
            self._ticker.join()
            self._ticker = None
            self.stream.write("\r\x1b[2K")
        self.note(f"[{index}/{self.total}] {label}: {text}")


# --- results and reports -----------------------------------------------------------------

def format_plan(sweep: Sweep) -> str:
    """The runs a sweep would make, and which of them an earlier start completed."""
    plan = sweep.plan()
    done = SweepStore(sweep.store_path).completed(sweep.sweep_id)
    lines = [f"sweep {sweep.sweep_id}: {count(len(sweep.points), 'point')} x "
             f"{count(sweep.repeats, 'repeat')} = "
             f"{len(plan)} runs into {sweep.out}"]
    for i, run in enumerate(plan, 1):
        state = "completed" if (run.point.key, run.repeat) in done else "to run"
        lines.append(f"  [{i}/{len(plan)}] {run.label}: {state}")
    return "\n".join(lines)


def format_outcome(outcome: Outcome) -> str:
    """The sweep's end: counts, a line per point over its completed runs, the failures."""
    sweep = outcome.sweep
    failed = len(outcome.plan) - outcome.completed
    lines = [f"sweep {sweep.sweep_id}: {len(outcome.plan)} runs, {outcome.completed} completed"
             f" ({outcome.earlier} earlier), {failed} failed or missing"]
    store = SweepStore(sweep.store_path)
    rows = {r["run_id"]: r for r in store.runs()}
    done = store.completed(sweep.sweep_id)
    width = max(len(p.label) for p in sweep.points)
    lines.append(f"  {'point':<{width}} {'runs':>4} {'val acc':>8} {'(min-max)':>15} "
                 f"{'samples/s':>10} {'wall s':>7}")
    for point in sweep.points:
        got = [rows[done[(point.key, r)]] for r in range(sweep.repeats)
               if (point.key, r) in done and done[(point.key, r)] in rows]
        if not got:
            lines.append(f"  {point.label:<{width}} {0:>4}")
            continue
        acc = [g["final_val_accuracy"] for g in got]
        spread = f"({min(acc):.4f}-{max(acc):.4f})" if len(acc) > 1 else ""
        lines.append(f"  {point.label:<{width}} {len(got):>4} {_mean(acc):>8.4f} {spread:>15} "
                     f"{_mean([g['samples_per_s'] for g in got]):>10.0f} "
                     f"{_mean([g['wall_s'] for g in got]):>7.1f}")
    if outcome.failures:
        lines.append("failed:")
        lines += [f"  {label}: {error}" for label, error in outcome.failures]
    if outcome.report is not None:
        lines.append(f"report: {outcome.report}")
    elif outcome.report_note:
        lines.append(outcome.report_note)
    return "\n".join(lines)


def count(n: int, noun: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def outcome_json(outcome: Outcome) -> str:
    return json.dumps({
        "sweep_id": outcome.sweep.sweep_id, "name": outcome.sweep.name,
        "runs": len(outcome.plan), "completed": outcome.completed, "earlier": outcome.earlier,
        "ran": outcome.ran, "failed": len(outcome.failures), "run_ids": outcome.run_ids,
        "failures": [{"run": label, "error": error} for label, error in outcome.failures],
        "report": str(outcome.report) if outcome.report else None})


def report_writer() -> tuple[Callable[..., Path] | None, str]:
    """polyrhythm.report.write_report, or None and why it cannot be imported."""
    try:
        from polyrhythm.report import write_report
    except ImportError as exc:
        return None, f"cannot import polyrhythm.report ({exc})"
    return write_report, ""


def report_sweep(outcome: Outcome) -> None:
    """Write the sweep's HTML report into <out>/sweeps/<id>/, or say why not."""
    sweep = outcome.sweep
    write, why = report_writer()
    if write is None:
        outcome.report_note = f"report skipped: {why}"
    elif not outcome.run_ids:
        outcome.report_note = "report skipped: no completed runs"
    else:
        title = _title(sweep.name, sweep.description)
        try:
            outcome.report = write(sweep.store_path, outcome.run_ids, sweep.dir, title,
                                   fmt="html")
        except PolyrhythmError as exc:
            outcome.report_note = f"report not written: {exc}"


def report_target(out: str | Path, run_ids: list[str], sweep_id: str | None,
                  latest: bool) -> tuple[str, str, list[str]]:
    """(report name, title, run ids) for `polyrhythm report`; ConfigError for unknown ids."""
    path = Path(out) / STORE_NAME
    if not path.exists():
        raise ConfigError(f"no run store at {str(path)!r}")
    if run_ids:
        stored = {r["run_id"] for r in RunStore(path).runs()}
        unknown = [r for r in run_ids if r not in stored]
        if unknown:
            raise ConfigError(f"unknown run id {unknown[0]!r} in {str(path)!r}")
        run_ids = list(dict.fromkeys(run_ids))
        if len(run_ids) == 1:
            return run_ids[0], f"run {run_ids[0]}", run_ids
        name = f"runs-{datetime.now(UTC):%Y%m%d-%H%M%S}"
        return name, f"{len(run_ids)} runs", run_ids
    sweeps = SweepStore(path)
    if latest:
        rows = sweeps.sweeps()
        if not rows:
            raise ConfigError(f"no sweep or comparison stored in {str(path)!r}")
        sweep_id = rows[0]["sweep_id"]
    row = sweeps.sweep(sweep_id)
    ids = sweeps.run_ids(sweep_id)
    if not ids:
        raise ConfigError(f"sweep {sweep_id!r} has no completed runs")
    return sweep_id, _title(row["name"], row["description"]), ids


def _title(name: str, description: str) -> str:
    """A sweep report's title: its name, then its description if it has one."""
    return f"{name}: {description}" if description else name
