"""`polyrhythm runs`: list the stored runs. Reads the store only: no runtime, no torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polyrhythm.metrics.launcher import read_identity
from polyrhythm.metrics.records import (
    STORE_NAME,
    compression_label,
    compression_section,
    repair_runs,
)
from polyrhythm.metrics.runfolder import UNRECORDED
from polyrhythm.metrics.store import LAUNCHER_GONE, RunStore


def add_parser(commands) -> None:
    runs = commands.add_parser("runs", help="list stored runs")
    runs.add_argument("--out", default="runs", help="runs directory (default: runs)")
    runs.add_argument("--json", action="store_true", help="one JSON object per run")
    runs.add_argument("--repair", action="store_true",
                      help="record the results that runs kept in their folders when the store "
                      "could not take them at their end (locked, a full disk), then list")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "repair", False):  # a caller's Namespace may predate --repair
        repaired = repair_runs(args.out)
        for run_id in repaired:
            print(f"recorded run {run_id} from the results it kept", file=sys.stderr)
        if not repaired:
            print(f"no kept results to record in {args.out}", file=sys.stderr)
    rows = RunStore(Path(args.out) / STORE_NAME).runs()
    if args.json:
        for r in rows:
            fields = {k: v for k, v in r.items() if k not in ("config", "summary")}
            fields["compress"] = compressor(r)
            fields["workers_at_end"] = workers_at_end(r)
            if fields.get("launcher"):  # as stored; null if it is not a launcher's JSON
                fields["launcher"] = read_identity(fields["launcher"])
            print(json.dumps(fields))
        return 0
    if not rows:
        print(f"no runs stored in {args.out}")
        return 0
    statuses = [status(r) for r in rows]
    width = max(10, *map(len, statuses))
    print(f"{'run id':<36} {'status':<{width}} {'strategy':<16} {'N':>5} {'S':>3} {'ep':>3} "
          f"{'val acc':>8} {'samples/s':>10} {'wall s':>8}  compress")
    for r, shown in zip(rows, statuses, strict=True):
        acc = f"{r['final_val_accuracy']:.4f}" if r["final_val_accuracy"] is not None else "-"
        sps = f"{r['samples_per_s']:.0f}" if r["samples_per_s"] is not None else "-"
        wall = f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "-"
        print(f"{r['run_id']:<36} {shown:<{width}} {r['strategy']:<16} {workers(r):>5} "
              f"{r['servers']:>3} {r['epochs']:>3} {acc:>8} {sps:>10} {wall:>8}  "
              f"{compressor(r)}")
    return 0


def workers_at_end(row: dict) -> int:
    """The workers a run had as it ended: those it started with, less those it went on
    without (its summary's lost_workers, once completed)."""
    try:
        lost = json.loads(row["summary"] or "{}").get("lost_workers") or []
    except (ValueError, AttributeError):  # a summary that is no JSON object: none known
        lost = []
    return row["workers"] - len(lost) if isinstance(lost, list) else row["workers"]


def workers(row: dict) -> str:
    """A run's workers as listed: `3`, or `3→2` for one that went on without a lost one."""
    end = workers_at_end(row)
    return str(row["workers"]) if end == row["workers"] else f"{row['workers']}→{end}"


def compressor(row: dict) -> str:
    """What a run compressed its messages with ("none", "topk ratio=0.01"): its config's
    [compression] section."""
    return compression_label(compression_section(row["config"]))


def status(row: dict) -> str:
    """A run's status as listed: `failed (launcher gone)` for a run whose launcher died
    without recording its end (the store found it so when opened), `failed (unrecorded:
    --repair)` for one that trained to its end but whose results the store could not take."""
    if row["status"] == "failed" and row["error"] in (LAUNCHER_GONE, UNRECORDED):
        return f"failed ({'unrecorded: --repair' if row['error'] == UNRECORDED else row['error']})"
    return row["status"]
