"""`polyrhythm report`: write a report of runs, a sweep or the latest sweep or comparison.
Reads the store only: no runtime, no torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.sweep import report_target, report_writer


def add_parser(commands) -> None:
    report = commands.add_parser(
        "report", help="write a report of runs, a sweep or the latest sweep/comparison")
    report.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to report on")
    report.add_argument("--sweep", metavar="SWEEP_ID", help="the completed runs of a sweep")
    report.add_argument("--latest", action="store_true",
                        help="the last sweep or comparison started")
    report.add_argument("--format", choices=("html", "md", "tensorboard"), default="html",
                        help="report format (default: html); tensorboard: event files to view "
                        "with `tensorboard --logdir`")
    report.add_argument("--target-accuracy", type=float, metavar="X",
                        help="add a table of each group's time to this validation accuracy "
                        "(a fraction in (0, 1], e.g. 0.95)")
    report.add_argument("--out", default="runs", metavar="DIR",
                        help="runs directory (default: runs); the report goes to "
                        "DIR/reports/<name>/")


def run(args: argparse.Namespace) -> int:
    chosen = sum([bool(args.run_ids), args.sweep is not None, args.latest])
    if chosen != 1:
        raise ConfigError("give run ids, --sweep SWEEP_ID or --latest (one of them)")
    target = args.target_accuracy
    if target is not None and not 0 < target <= 1:
        raise ConfigError(f"--target-accuracy must be a fraction in (0, 1], got {target:g}")
    name, title, run_ids = report_target(args.out, args.run_ids, args.sweep, args.latest)
    write, why = report_writer()
    if write is None:
        raise PolyrhythmError(f"no report: {why}")
    path = write(Path(args.out) / STORE_NAME, run_ids, Path(args.out) / "reports" / name, title,
                 fmt=args.format, target_accuracy=target)
    print(path)
    return 0
