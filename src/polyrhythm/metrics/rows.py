"""What each column of the run store holds, and the check of every row read from it.

SQLite keeps whatever value a statement gives a column, whatever its declared type, and a
store edited by hand (or by another program, or half-written by a damaged disk) may hold
text where a count belongs, a blob, NULL where polyrhythm never writes one, or lack a
column. Every row the store hands out is checked against the kinds below, so such a store
is a one-line StoreError naming the table, the run and the column, and never a traceback
from wherever the value is used (a listing's format, the simulator's arithmetic, a figure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from polyrhythm.errors import StoreError
from polyrhythm.files import shown


@dataclass(frozen=True)
class Kind:
    """What a column holds: values of `types` (exactly: the store never returns a bool),
    at least `least` if given, finite if `finite`; `text` says so in a message."""

    types: tuple[type, ...]
    text: str
    least: int | None = None
    finite: bool = False

    def holds(self, value: object) -> bool:
        return (type(value) in self.types
                and (self.least is None or value is None or value >= self.least)
                and not (self.finite and type(value) is float and not math.isfinite(value)))


_NULL = type(None)
TEXT = Kind((str,), "text")
TEXT_OR_NULL = Kind((str, _NULL), "text or NULL")
COUNT = Kind((int,), "an integer")
INDEX = Kind((int,), "an integer of at least 0", 0)  # a worker's, server's, rank's, step's
INDEX_OR_NULL = Kind((int, _NULL), "an integer of at least 0 or NULL", 0)
# A resource sample's process: a rank, or -1 for a Spark run's driver (launch/spark_resources).
SAMPLED = Kind((int,), "an integer of at least -1", -1)
FLAG_OR_NULL = Kind((int, _NULL), "an integer or NULL")
# The event series are measurements: finite (a figure's range, a replayed compute time).
NUMBER = Kind((int, float), "a finite number", finite=True)
NUMBER_OR_NULL = Kind((int, float, _NULL), "a number or NULL")

# What polyrhythm writes into each column of each table it reads back.
COLUMNS: dict[str, dict[str, Kind]] = {
    "runs": {
        "run_id": TEXT, "created": TEXT, "status": TEXT, "strategy": TEXT,
        "workers": Kind((int,), "an integer of at least 1", 1), "servers": INDEX,
        "epochs": INDEX, "dataset": TEXT, "model": TEXT, "config": TEXT,
        "summary": TEXT_OR_NULL, "error": TEXT_OR_NULL, "final_val_accuracy": NUMBER_OR_NULL,
        "samples_per_s": NUMBER_OR_NULL, "wall_s": NUMBER_OR_NULL, "launcher": TEXT_OR_NULL},
    "epochs": {
        "run_id": TEXT, "epoch": COUNT, "train_loss": NUMBER_OR_NULL,
        "val_loss": NUMBER_OR_NULL, "val_accuracy": NUMBER_OR_NULL,
        "samples_per_s": NUMBER_OR_NULL, "wall_s": NUMBER_OR_NULL, "phase": TEXT_OR_NULL,
        "rule_score": NUMBER_OR_NULL, "rule_fired": FLAG_OR_NULL, "rule_why": TEXT_OR_NULL},
    "iterations": {"worker": INDEX, "step": INDEX, "epoch": COUNT, "t": NUMBER,
                   "compute_s": NUMBER, "push_s": NUMBER, "wait_s": NUMBER, "pull_s": NUMBER,
                   "apply_s": NUMBER, "compress_s": NUMBER, "read_s": NUMBER,
                   "total_s": NUMBER},
    "pushes": {"server": INDEX, "t": NUMBER, "worker": INDEX, "staleness": COUNT,
               "queue": COUNT},
    "updates": {"server": INDEX, "t": NUMBER, "seconds": NUMBER},
    "resources": {"rank": SAMPLED, "role": TEXT, "t": NUMBER, "cpu_percent": NUMBER,
                  "rss_bytes": NUMBER, "bytes_sent": NUMBER, "bytes_received": NUMBER},
    "membership": {"t": NUMBER_OR_NULL, "worker": INDEX, "rank": INDEX, "host": INDEX_OR_NULL,
                   "cause": TEXT, "workers": INDEX},
    "sweeps": {"sweep_id": TEXT, "name": TEXT, "kind": TEXT, "description": TEXT,
               "created": TEXT, "updated": TEXT, "plan": TEXT},
    "sweep_runs": {"sweep_id": TEXT, "point_key": TEXT, "repeat": COUNT,
                   "run_id": TEXT_OR_NULL, "status": TEXT, "error": TEXT_OR_NULL,
                   "updated": TEXT},
}


def checked(table: str, row: dict, path: Path, owner: object) -> dict:
    """`row` of `table` (of the store at `path`; `owner`: the run or sweep it belongs to,
    for the message) if each of its columns holds what polyrhythm writes there; else a
    one-line StoreError. Columns a query did not select are not looked for."""
    for column, kind in COLUMNS[table].items():
        if column in row and not kind.holds(row[column]):
            raise StoreError(f"run store {str(path)!r} is damaged: the {table} row of "
                             f"{shown(owner)} holds {shown(row[column])} as {column}, "
                             f"where polyrhythm writes {kind.text}")
    return row
