"""The SQLite run store (`<out>/polyrhythm.db`).

Schema version 3 (version 1 had `runs` and `epochs`, 2 added the event tables, 3 the
Strategy-Switch columns of `epochs`; opening an older store adds what it lacks):
- runs: one row per run (status, config, summary, headline figures);
- epochs: per run and epoch (losses, validation accuracy, samples/s, wall time; for a switch
  run the phase, and the rule's score, whether it fired and why, asked after the epoch);
- iterations: per run, worker and training step: when it started (seconds since the job's
  start), and the seconds of compute, push, wait, pull and apply, and in all;
- pushes: per run and gradient applied on a server: when, from which worker, its staleness and
  the server's queue (messages waiting behind it);
- updates: per run and weight update on a server: when, and how long it took;
- resources: per run, process and sample (about 1 Hz): role, CPU %, RSS bytes and the bytes
  the process had sent and received so far.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polyrhythm.errors import StoreError
from polyrhythm.metrics.recorder import SPAN_NAMES

SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    status TEXT NOT NULL,             -- running | completed | failed
    strategy TEXT NOT NULL,
    workers INTEGER NOT NULL,
    servers INTEGER NOT NULL,
    epochs INTEGER NOT NULL,
    dataset TEXT NOT NULL,
    model TEXT NOT NULL,
    config TEXT NOT NULL,             -- resolved config, TOML
    summary TEXT,                     -- summary.json, once completed
    error TEXT,                       -- one line, once failed
    final_val_accuracy REAL,
    samples_per_s REAL,
    wall_s REAL
);
CREATE TABLE IF NOT EXISTS epochs (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    epoch INTEGER NOT NULL,
    train_loss REAL,
    val_loss REAL,
    val_accuracy REAL,
    samples_per_s REAL,
    wall_s REAL,
    PRIMARY KEY (run_id, epoch)
);
"""

_SCHEMA_2 = """
CREATE TABLE IF NOT EXISTS iterations (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    worker INTEGER NOT NULL,
    step INTEGER NOT NULL,            -- 0-based over the whole run
    epoch INTEGER NOT NULL,
    t REAL NOT NULL,                  -- start, seconds since the job started
    compute_s REAL NOT NULL,
    push_s REAL NOT NULL,
    wait_s REAL NOT NULL,
    pull_s REAL NOT NULL,
    apply_s REAL NOT NULL,
    total_s REAL NOT NULL,
    PRIMARY KEY (run_id, worker, step)
);
CREATE TABLE IF NOT EXISTS pushes (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    server INTEGER NOT NULL,
    t REAL NOT NULL,
    worker INTEGER NOT NULL,
    staleness INTEGER NOT NULL,
    queue INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS updates (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    server INTEGER NOT NULL,
    t REAL NOT NULL,
    seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS resources (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    rank INTEGER NOT NULL,
    role TEXT NOT NULL,               -- server | worker
    t REAL NOT NULL,
    cpu_percent REAL NOT NULL,
    rss_bytes INTEGER NOT NULL,
    bytes_sent INTEGER NOT NULL,
    bytes_received INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS pushes_run ON pushes(run_id);
CREATE INDEX IF NOT EXISTS updates_run ON updates(run_id);
CREATE INDEX IF NOT EXISTS resources_run ON resources(run_id);
"""

_SCHEMA_3 = """
ALTER TABLE epochs ADD COLUMN phase TEXT;
ALTER TABLE epochs ADD COLUMN rule_score REAL;
ALTER TABLE epochs ADD COLUMN rule_fired INTEGER;
ALTER TABLE epochs ADD COLUMN rule_why TEXT;
"""

# The per-event tables and their columns after run_id, in the order of the rows runs report.
SERIES = {
    "iterations": ("worker", "step", "epoch", "t", *(f"{s}_s" for s in SPAN_NAMES), "total_s"),
    "pushes": ("server", "t", "worker", "staleness", "queue"),
    "updates": ("server", "t", "seconds"),
    "resources": ("rank", "role", "t", "cpu_percent", "rss_bytes", "bytes_sent",
                  "bytes_received"),
}

RUN_COLUMNS = ("strategy", "workers", "servers", "epochs", "dataset", "model")
RULE_FIELDS = ("phase", "rule_score", "rule_fired", "rule_why")  # None but in switch runs
EPOCH_COLUMNS = ("epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_s", "wall_s",
                 *RULE_FIELDS)


class RunStore:
    """Opens (and creates or migrates) the store on every call; safe across processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open run store {str(self.path)!r}: {exc}") from None
        conn.row_factory = sqlite3.Row
        try:
            with conn:
                self._migrate(conn)
                yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"run store {str(self.path)!r}: {exc}") from None
        finally:
            conn.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"run store schema {version} is newer than this polyrhythm's "
                             f"({SCHEMA_VERSION}); upgrade polyrhythm")
        if version < 1:
            conn.executescript(_SCHEMA)
        if version < 2:
            conn.executescript(_SCHEMA_2)
        if version < 3:
            conn.executescript(_SCHEMA_3)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def add_run(self, run_id: str, created: str, columns: dict, config_toml: str) -> None:
        """A 'running' row; `columns` holds strategy, workers, servers, epochs, dataset and
        model (RunConfig.columns())."""
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, created, status, strategy, workers, servers, epochs,"
                " dataset, model, config) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (run_id, created, *(columns[c] for c in RUN_COLUMNS), config_toml))

    def complete_run(self, run_id: str, summary: dict, epochs: list[dict],
                     series: dict[str, list[tuple]] | None = None) -> None:
        """Mark the run completed with its summary, epochs and event series (see SERIES)."""
        with self._connect() as conn:
            conn.execute(
                "UPDATE runs SET status = 'completed', summary = ?, final_val_accuracy = ?,"
                " samples_per_s = ?, wall_s = ? WHERE run_id = ?",
                (json.dumps(summary), summary["final_val_accuracy"], summary["samples_per_s"],
                 summary["wall_s"], run_id))
            conn.executemany(
                f"INSERT OR REPLACE INTO epochs (run_id, {', '.join(EPOCH_COLUMNS)})"
                f" VALUES (?{', ?' * len(EPOCH_COLUMNS)})",
                [(run_id, *(row.get(c) for c in EPOCH_COLUMNS)) for row in epochs])
            for table, rows in (series or {}).items():
                columns = SERIES[table]
                conn.executemany(
                    f"INSERT INTO {table} (run_id, {', '.join(columns)})"
                    f" VALUES (?{', ?' * len(columns)})", [(run_id, *row) for row in rows])

    def amend_summary(self, run_id: str, summary: dict) -> None:
        """Replace a completed run's summary (its launcher adds what only it measured)."""
        with self._connect() as conn:
            conn.execute("UPDATE runs SET summary = ? WHERE run_id = ?",
                         (json.dumps(summary), run_id))

    def fail_run(self, run_id: str, error: str) -> bool:
        """Mark a running run failed; a run already completed stays so. True if marked."""
        with self._connect() as conn:
            cursor = conn.execute("UPDATE runs SET status = 'failed', error = ?"
                                  " WHERE run_id = ? AND status = 'running'", (error, run_id))
            return cursor.rowcount == 1

    def reopen_run(self, run_id: str) -> bool:
        """Mark a failed run running again (it is being resumed). True if marked."""
        with self._connect() as conn:
            cursor = conn.execute("UPDATE runs SET status = 'running', error = NULL"
                                  " WHERE run_id = ? AND status = 'failed'", (run_id,))
            return cursor.rowcount == 1

    def runs(self) -> list[dict]:
        """Every stored run, oldest first."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY created, run_id")]

    def run(self, run_id: str) -> dict | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            return dict(row) if row else None

    def series(self, table: str, run_id: str) -> list[dict]:
        """One run's rows of an event table (iterations, pushes, updates, resources)."""
        if table not in SERIES:
            raise ValueError(f"unknown series {table!r}")
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(
                f"SELECT {', '.join(SERIES[table])} FROM {table} WHERE run_id = ?"
                f" ORDER BY t", (run_id,))]

    def epochs(self, run_id: str) -> list[dict]:
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(
                "SELECT * FROM epochs WHERE run_id = ? ORDER BY epoch", (run_id,))]
