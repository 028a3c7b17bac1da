"""The sweep tables of the run store: `sweeps` (id, name, kind, the plan of its last start)
and `sweep_runs` (sweep_id, point_key, repeat, run_id, status, error): which (point, repeat)
of a sweep completed, so a sweep run again finishes where it stopped."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from polyrhythm.errors import ConfigError, StoreError
from polyrhythm.files import shown
from polyrhythm.metrics.rows import COLUMNS
from polyrhythm.metrics.store import RunStore
from polyrhythm.sweep.plan import PlannedRun, Sweep

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


_SWEEPS = ", ".join(COLUMNS["sweeps"])  # every column, named: none may be missing
_SWEEP_RUNS = ", ".join(COLUMNS["sweep_runs"])


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
            return [self._checked("sweep_runs", dict(r), sweep_id) for r in conn.execute(
                f"SELECT {_SWEEP_RUNS} FROM sweep_runs WHERE sweep_id = ? ORDER BY updated",
                (sweep_id,))]

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
            return [self._checked("sweeps", dict(r), r["sweep_id"]) for r in conn.execute(
                f"SELECT {_SWEEPS} FROM sweeps ORDER BY updated DESC, rowid DESC")]

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
        return [done[(key, repeat)] for key, repeat in self._plan(sweep_id) if (key, repeat)
                in done]

    def _plan(self, sweep_id: str) -> list[tuple[str, int]]:
        """The (point key, repeat) pairs of the sweep's last plan, as `begin` stored them."""
        try:
            plan = json.loads(self.sweep(sweep_id)["plan"])
        except (ValueError, RecursionError):
            plan = None
        if not (isinstance(plan, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                and type(p[1]) is int for p in plan)):
            raise StoreError(f"run store {str(self.path)!r} is damaged: sweep "
                             f"{shown(sweep_id)}'s plan is not the list of (point, repeat) "
                             "pairs polyrhythm stores")
        return [(key, repeat) for key, repeat in plan]
