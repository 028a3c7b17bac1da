"""The run store's tables (metrics/store.py), version by version.

Schema version 7 (version 1 had `runs` and `epochs`, 2 added the event tables, 3 the
Strategy-Switch columns of `epochs`, 4 the `launcher` of `runs`, 5 the `compress_s` of
`iterations`, 6 its `read_s`, 7 `membership`; opening an older store adds what it lacks):
- runs: one row per run (status, config, summary, headline figures, and the process that
  launched it: host, boot, pid and start time, as JSON);
- epochs: per run and epoch (losses, validation accuracy, samples/s, wall time; for a switch
  run the phase, and the rule's score, whether it fired and why, asked after the epoch);
- iterations: per run, worker and training step: when it started (seconds since the job's
  start), and the seconds of compute, push, wait, pull, apply, compress and read, and in all;
- pushes: per run and gradient applied on a server: when, from which worker, its staleness and
  the server's queue (messages waiting behind it);
- updates: per run and weight update on a server: when, and how long it took;
- resources: per run, process and sample (about 1 Hz): role, CPU %, RSS bytes and the bytes
  the process had sent and received so far;
- membership: per run and change of its workers (on_worker_failure = continue): when (NULL:
  seen only after training), which worker and rank, its emulated host (NULL: none), the
  cause (`lost`) and the workers the run had after it.
"""

from __future__ import annotations

from polyrhythm.metrics.recorder import SPAN_NAMES

SCHEMA_VERSION = 7

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    status TEXT NOT NULL,             -- running | completed | failed | diverged
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

# The process that launched the run, as JSON (process_identity): host, pidns, boot, pid, start.
_SCHEMA_4 = """
ALTER TABLE runs ADD COLUMN launcher TEXT;
"""

# The seconds of an iteration spent encoding and decoding compressed messages.
_SCHEMA_5 = """
ALTER TABLE iterations ADD COLUMN compress_s REAL NOT NULL DEFAULT 0;
"""

_SCHEMA_6 = """
ALTER TABLE iterations ADD COLUMN read_s REAL NOT NULL DEFAULT 0;
"""

_SCHEMA_7 = """
CREATE TABLE IF NOT EXISTS membership (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    t REAL,
    worker INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    host INTEGER,
    cause TEXT NOT NULL,              -- lost
    workers INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS membership_run ON membership(run_id);
"""

# The scripts that bring a store from version i to i + 1, in order.
MIGRATIONS = (_SCHEMA, _SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5, _SCHEMA_6, _SCHEMA_7)

# The per-event tables and their columns after run_id, in the order of the rows runs report.
SERIES = {
    "iterations": ("worker", "step", "epoch", "t", *(f"{s}_s" for s in SPAN_NAMES), "total_s"),
    "pushes": ("server", "t", "worker", "staleness", "queue"),
    "updates": ("server", "t", "seconds"),
    "resources": ("rank", "role", "t", "cpu_percent", "rss_bytes", "bytes_sent",
                  "bytes_received"),
    "membership": ("t", "worker", "rank", "host", "cause", "workers"),
}

RUN_COLUMNS = ("strategy", "workers", "servers", "epochs", "dataset", "model")
RULE_FIELDS = ("phase", "rule_score", "rule_fired", "rule_why")  # None but in switch runs
EPOCH_COLUMNS = ("epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_s", "wall_s",
                 *RULE_FIELDS)
