"""Hostile inputs for tests: a small run store written column by column (so a test can put
anything into any column, NULL and blobs included, or leave a column out), and the probe
of a call that may block forever, run in a process of its own with a bound."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import polyrhythm
from polyrhythm.config import make_config
from polyrhythm.metrics.store import SCHEMA_VERSION, RunStore
from polyrhythm.sweep import SweepStore

RUN_ID = "20260101-000000-bsp-000001"
SWEEP_ID = "hostile"
WORKERS, STEPS = 2, 4
PROBE_BOUND_S = 120.0  # a probe that has not answered by then is blocked, not slow


def summary(out: Path) -> dict[str, Any]:
    """A completed bsp run's summary (2 workers, a server): what calibration and the report
    read of it."""
    per_worker = [{"worker": w, "steps": STEPS, "train_s": 0.4, "samples_per_s": 80.0,
                   "idleness": 0.1, "compute_s": 0.2, "push_s": 0.05, "wait_s": 0.04,
                   "pull_s": 0.05, "apply_s": 0.0, "compress_s": 0.0, "read_s": 0.01}
                  for w in range(WORKERS)]
    return {"run_id": RUN_ID, "status": "completed", "strategy": "bsp", "workers": WORKERS,
            "servers": 1, "epochs": 2, "final_val_accuracy": 0.9, "samples_per_s": 160.0,
            "wall_s": 1.0, "warmup_steps": 1, "parameters": 1000, "weight_updates": STEPS,
            "update_s_per_server": [0.004], "staleness_mean": 0.0,
            "staleness_histogram": {"0": STEPS * WORKERS}, "per_worker": per_worker,
            "traffic_per_rank": [{"rank": r, "bytes_sent": 4000, "bytes_received": 4000,
                                  "native_collective_bytes": 0} for r in range(3)],
            "data": {"sharding": "random", "shards": [
                {"worker": w, "examples": 50, "copies": 0, "class_counts": [25, 25],
                 "imbalance": 1.0, "distance": 0.0} for w in range(WORKERS)]},
            "run_dir": str(out / RUN_ID)}


def rows(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows of a store holding that one completed run, and a sweep of it."""
    config = make_config({"strategy": "bsp", "workers": WORKERS, "epochs": 2,
                          "out": str(out)})
    run = {"run_id": RUN_ID, "created": "2026-01-01T00:00:00+00:00", "status": "completed",
           **config.columns(), "config": config.to_toml(),
           "summary": json.dumps(summary(out)), "error": None, "final_val_accuracy": 0.9,
           "samples_per_s": 160.0, "wall_s": 1.0, "launcher": None}
    iterations = [{"run_id": RUN_ID, "worker": w, "step": s, "epoch": s // 2, "t": 0.1 * s,
                   "compute_s": 0.05, "push_s": 0.01, "wait_s": 0.01, "pull_s": 0.01,
                   "apply_s": 0.0, "compress_s": 0.0, "read_s": 0.0, "total_s": 0.1}
                  for w in range(WORKERS) for s in range(STEPS)]
    point = json.dumps({"strategy": "bsp"}, sort_keys=True, separators=(",", ":"))
    return {
        "runs": [run],
        "epochs": [{"run_id": RUN_ID, "epoch": e, "train_loss": 1.0, "val_loss": 1.1,
                    "val_accuracy": 0.8 + 0.1 * e, "samples_per_s": 160.0, "wall_s": 0.5 * e,
                    "phase": None, "rule_score": None, "rule_fired": None, "rule_why": None}
                   for e in range(2)],
        "iterations": iterations,
        "pushes": [{"run_id": RUN_ID, "server": 0, "t": it["t"], "worker": it["worker"],
                    "staleness": 0, "queue": 0} for it in iterations],
        "updates": [{"run_id": RUN_ID, "server": 0, "t": 0.1 * s, "seconds": 0.004}
                    for s in range(STEPS)],
        "resources": [{"run_id": RUN_ID, "rank": r, "role": "server" if r == 0 else "worker",
                       "t": float(t), "cpu_percent": 50.0, "rss_bytes": 2**27,
                       "bytes_sent": 1000 * t, "bytes_received": 1000 * t}
                      for r in range(3) for t in range(2)],
        "sweeps": [{"sweep_id": SWEEP_ID, "name": "hostile", "kind": "sweep",
                    "description": "", "created": run["created"], "updated": run["created"],
                    "plan": json.dumps([[point, 0]])}],
        "sweep_runs": [{"sweep_id": SWEEP_ID, "point_key": point, "repeat": 0,
                        "run_id": RUN_ID, "status": "completed", "error": None,
                        "updated": run["created"]}],
    }


@functools.cache
def store_columns() -> dict[str, tuple[str, ...]]:
    """Every table of a run store (sweep tables too) and its columns, as the store makes
    them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "polyrhythm.db"
        config = make_config({"out": tmp})
        RunStore(path).add_run("x", "now", config.columns(), config.to_toml())
        SweepStore(path).sweeps()  # adds the sweep tables
        conn = sqlite3.connect(path)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {t: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({t})"))
                    for t in tables}
        finally:
            conn.close()


def write_store(out: Path, tables: dict[str, list[dict[str, Any]]],
                dropped: dict[str, str] | None = None) -> Path:
    """The store `<out>/polyrhythm.db` holding `tables`' rows as given, every column
    without a type or constraint (so any value goes in, NULL included), at the current
    schema version (so nothing migrates it); `dropped` leaves a table's column out."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "polyrhythm.db"
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        for table, all_columns in store_columns().items():
            columns = [c for c in all_columns if (dropped or {}).get(table) != c]
            conn.execute(f"CREATE TABLE {table} ({', '.join(columns)})")
            for row in tables.get(table, []):
                conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                             f"({', '.join('?' * len(columns))})",
                             [row.get(c) for c in columns])
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.commit()
    finally:
        conn.close()
    return path


def probe(code: str, bound_s: float = PROBE_BOUND_S) -> subprocess.CompletedProcess[str]:
    """Run `code` (Python, dedented) in a process of its own; its result, or an
    AssertionError if it has not ended within `bound_s` seconds (it blocked): a test of
    something that may block forever never blocks the suite."""
    # The probe runs the polyrhythm this process runs.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(polyrhythm.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=bound_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"blocked: no answer within {bound_s:.0f} s") from None
