"""The SQLite run store (`<out>/polyrhythm.db`).

Its tables and their versions: metrics/schema.py.

Several processes use one store at once (launchers, rank 0s completing runs, sweeps, reports):
the store is in WAL mode (readers never wait for a writer, nor a writer for readers), every
connection waits up to BUSY_TIMEOUT_S for another's write, a write takes the write lock when
it begins (BEGIN IMMEDIATE: a transaction that read first cannot fail to upgrade), and a
migration happens under that lock, once. Every value is an SQL parameter; only table and
column names, which are constants of this module, are formatted into statements.

A run still `running` whose launcher was a process of this host that is gone (its pid no
longer exists, or belongs to a process started at another time) is marked `failed` with the
error `launcher gone` when the runs are listed (`RunStore.runs`: `polyrhythm runs`, reports,
sweeps), and before a run is resumed (`polyrhythm train --resume`). Runs launched on other
hosts, or by a process that still lives, are left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polyrhythm.errors import StoreError
from polyrhythm.metrics.launcher import launcher_gone, process_identity, read_identity
from polyrhythm.metrics.rows import COLUMNS, checked
from polyrhythm.metrics.runfolder import kept_reason
from polyrhythm.metrics.schema import (  # noqa: F401 - RULE_FIELDS, SCHEMA_VERSION: re-exported
    EPOCH_COLUMNS,
    MIGRATIONS,
    RULE_FIELDS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    SERIES,
)

JOURNAL_MODE = "WAL"
# How long a connection waits for another's write before failing (POLYRHYTHM_STORE_WAIT_S).
BUSY_TIMEOUT_S = 30.0
LAUNCHER_GONE = "launcher gone"  # the error of a run whose launcher died without saying so

_RUNS = ", ".join(COLUMNS["runs"])  # every column a run's row has, named: none may be missing


class RunStore:
    """Opens (and creates or migrates) the store on every call; safe across processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction, committed at the end of the block (rolled back
        if it raises). `write` takes the write lock at once (BEGIN IMMEDIATE), waiting for
        another writer up to BUSY_TIMEOUT_S; a reader (write=False) waits for nobody."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit at the driver: the transactions are the ones begun here.
            conn = sqlite3.connect(self.path, timeout=busy_timeout(), isolation_level=None)
        except (OSError, ValueError, sqlite3.Error) as exc:  # ValueError: a null byte
            raise StoreError(f"cannot open run store {str(self.path)!r}: {exc}") from None
        conn.row_factory = sqlite3.Row
        try:
            _use_journal_mode(conn)
            self._migrate(conn)
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if conn.in_transaction:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"run store {str(self.path)!r}: {exc}") from None
        finally:
            conn.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Bring the store to SCHEMA_VERSION (a new one from nothing), once: under the write
        lock, so processes opening an older store at the same time do not race. `conn` is
        in autocommit; no transaction is left open."""
        if _schema_version(conn) == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _schema_version(conn)  # another process may have migrated meanwhile
            for script in MIGRATIONS[version:]:
                for statement in _statements(script):
                    conn.execute(statement)
            if version < SCHEMA_VERSION:
                # A constant: PRAGMA takes no parameters.
                conn.execute(f"PRAGMA user_version = {int(SCHEMA_VERSION)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def add_run(self, run_id: str, created: str, columns: dict, config_toml: str,
                launcher: dict | None = None, private: bool = False) -> None:
        """A 'running' row; `columns` holds strategy, workers, servers, epochs, dataset and
        model (RunConfig.columns()); `launcher` is the process that runs it (see
        process_identity: this process unless given). A store made now is its owner's
        alone where `private` (0600: SQLite gives its journal files the same mode)."""
        launcher = launcher if launcher is not None else process_identity()
        if private:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, created, status, strategy, workers, servers, epochs,"
                " dataset, model, config, launcher)"
                " VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, created, *(columns[c] for c in RUN_COLUMNS), config_toml,
                 json.dumps(launcher)))

    def complete_run(self, run_id: str, summary: dict, epochs: list[dict],
                     series: dict[str, list[tuple]] | None = None) -> None:
        """Mark the run completed with its summary, epochs and event series (see SERIES);
        its epochs column becomes the summary's (a script's own count)."""
        with self._connect() as conn:
            conn.execute(
                "UPDATE runs SET status = 'completed', summary = ?, final_val_accuracy = ?,"
                " samples_per_s = ?, wall_s = ?, epochs = COALESCE(?, epochs) WHERE run_id = ?",
                (json.dumps(summary), summary["final_val_accuracy"], summary["samples_per_s"],
                 summary["wall_s"], summary.get("epochs"), run_id))
            conn.executemany(
                f"INSERT OR REPLACE INTO epochs (run_id, {', '.join(EPOCH_COLUMNS)})"
                f" VALUES (?{', ?' * len(EPOCH_COLUMNS)})",
                [(run_id, *(row.get(c) for c in EPOCH_COLUMNS)) for row in epochs])
            for table, rows in (series or {}).items():
                if table not in SERIES:  # names only from SERIES go into the statement
                    raise ValueError(f"unknown series {table!r}")
                columns = SERIES[table]
                conn.executemany(
                    f"INSERT INTO {table} (run_id, {', '.join(columns)})"
                    f" VALUES (?{', ?' * len(columns)})", [(run_id, *row) for row in rows])

    def amend_summary(self, run_id: str, summary: dict) -> None:
        """Replace a completed run's summary (its launcher adds what only it measured)."""
        with self._connect() as conn:
            conn.execute("UPDATE runs SET summary = ? WHERE run_id = ?",
                         (json.dumps(summary), run_id))

    def fail_run(self, run_id: str, error: str, status: str = "failed") -> bool:
        """Mark a running run failed (or `diverged`: its loss or parameters went non-finite);
        a run already completed stays so. True if marked. The reason replaces LAUNCHER_GONE,
        which a listing guessed (an emulated run's janitor, which outlives its launcher, says
        what happened)."""
        with self._connect() as conn:
            cursor = conn.execute("UPDATE runs SET status = ?, error = ?"
                                  " WHERE run_id = ? AND (status = 'running'"
                                  " OR (status = 'failed' AND error = ?))",
                                  (status, error, run_id, LAUNCHER_GONE))
            return cursor.rowcount == 1

    def reopen_run(self, run_id: str, launcher: dict | None = None) -> bool:
        """Mark a failed run running again (it is being resumed), by `launcher` (this process
        unless given): the one now watched for (see fail_orphans). True if marked."""
        launcher = launcher if launcher is not None else process_identity()
        with self._connect() as conn:
            cursor = conn.execute("UPDATE runs SET status = 'running', error = NULL,"
                                  " launcher = ? WHERE run_id = ? AND status IN ('failed',"
                                  " 'diverged')",
                                  (json.dumps(launcher), run_id))
            return cursor.rowcount == 1

    def fail_orphans(self, run_id: str | None = None) -> list[str]:
        """Mark failed, with the error LAUNCHER_GONE, every running run (or only `run_id`)
        whose launcher was a process of this host that is gone; return their ids. Runs of
        other hosts, and of a launcher that still lives (or that this process cannot tell),
        are left alone; so is everything if the store cannot be written now (the next
        listing tries again)."""
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            running = conn.execute("SELECT run_id, launcher FROM runs WHERE status = 'running'"
                                   " AND launcher IS NOT NULL AND (? IS NULL OR run_id = ?)",
                                   (run_id, run_id)).fetchall()
        if not running:
            return []
        here = process_identity()
        gone = [r["run_id"] for r in running if launcher_gone(read_identity(r["launcher"]), here)]
        if not gone:
            return []
        try:
            with self._connect() as conn:
                # Still running: a run completed meanwhile stays completed.
                return [orphan for orphan in gone if conn.execute(
                    "UPDATE runs SET status = 'failed', error = ?"
                    " WHERE run_id = ? AND status = 'running'",
                    (kept_reason(self.path.parent, orphan) or LAUNCHER_GONE, orphan)).rowcount == 1]
        except StoreError:
            return []

    def runs(self) -> list[dict]:
        """Every stored run, oldest first (runs whose launcher is gone marked failed first:
        see fail_orphans)."""
        if not self.path.exists():
            return []
        self.fail_orphans()
        with self._connect(write=False) as conn:
            return [self._checked("runs", dict(r)) for r in conn.execute(
                f"SELECT {_RUNS} FROM runs ORDER BY created, run_id")]

    def run(self, run_id: str) -> dict | None:
        with self._connect(write=False) as conn:
            row = conn.execute(f"SELECT {_RUNS} FROM runs WHERE run_id = ?",
                               (run_id,)).fetchone()
            return self._checked("runs", dict(row)) if row else None

    def _checked(self, table: str, row: dict, owner: object = None) -> dict:
        """A row as read, checked (metrics/rows.py): a damaged store is a StoreError."""
        return checked(table, row, self.path, row.get("run_id") if owner is None else owner)

    def series(self, table: str, run_id: str) -> list[dict]:
        """One run's rows of an event table (iterations, pushes, updates, resources)."""
        if table not in SERIES:
            raise ValueError(f"unknown series {table!r}")
        with self._connect(write=False) as conn:
            return [self._checked(table, dict(r), run_id) for r in conn.execute(
                f"SELECT {', '.join(SERIES[table])} FROM {table} WHERE run_id = ?"
                f" ORDER BY t", (run_id,))]

    def epochs(self, run_id: str) -> list[dict]:
        with self._connect(write=False) as conn:
            return [self._checked("epochs", dict(r)) for r in conn.execute(
                f"SELECT run_id, {', '.join(EPOCH_COLUMNS)} FROM epochs WHERE run_id = ?"
                " ORDER BY epoch", (run_id,))]


def busy_timeout() -> float:
    """BUSY_TIMEOUT_S, or POLYRHYTHM_STORE_WAIT_S where set (seconds, > 0): how long a write
    waits for another process's lock before the store reports it locked."""
    try:
        seconds = float(os.environ.get("POLYRHYTHM_STORE_WAIT_S", BUSY_TIMEOUT_S))
    except ValueError:
        return BUSY_TIMEOUT_S
    return seconds if 0 < seconds < 86_400 else BUSY_TIMEOUT_S


def _schema_version(conn: sqlite3.Connection) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"run store schema {version} is newer than this polyrhythm's "
                         f"({SCHEMA_VERSION}); upgrade polyrhythm")
    return version


def _statements(script: str) -> Iterator[str]:
    """The SQL statements of a script, one by one (executescript would commit the open
    transaction)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement.strip()
            statement = ""
    if statement.strip():
        yield statement.strip()


def _use_journal_mode(conn: sqlite3.Connection) -> None:
    """Switch the store to JOURNAL_MODE (it stays so: a no-op once done). A store that cannot
    switch now (read-only, or another process holds it) keeps its mode: the busy timeout and
    immediate write transactions keep it safe, and the next connection tries again."""
    if conn.execute("PRAGMA journal_mode").fetchone()[0].upper() == JOURNAL_MODE:
        return
    with contextlib.suppress(sqlite3.OperationalError):
        conn.execute(f"PRAGMA journal_mode = {JOURNAL_MODE}")  # a constant
