"""`polyrhythm sweep FILE.toml`: run every point of a sweep file's grid, resumably."""

from __future__ import annotations

import argparse

from polyrhythm.sweep import (
    Sweep,
    format_outcome,
    format_plan,
    load_sweep,
    outcome_json,
    report_sweep,
    run_sweep,
)


def add_parser(commands) -> None:
    sweep = commands.add_parser(
        "sweep", help="run a grid of configs x repeats from a sweep file (resumable)",
        description="Run every point of a sweep file's grid, `repeats` times each, skipping "
        "the runs an earlier start of the same sweep completed. See README: Sweeps.")
    sweep.add_argument("file", metavar="FILE.toml", help="sweep file: name, repeats, [base], "
                       "[grid]")
    sweep.add_argument("--out", metavar="DIR", help="runs directory (default: base.out or runs)")
    sweep.add_argument("--id", dest="sweep_id", metavar="ID",
                       help="sweep id (default: the slug of the file's name)")
    sweep.add_argument("--dry-run", action="store_true",
                       help="check every point and list the runs; run nothing")
    sweep.add_argument("--json", action="store_true",
                       help="print the outcome as one JSON object on the last line")


def run(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.file, sweep_id=args.sweep_id, out=args.out)
    if args.dry_run:
        print(format_plan(sweep))
        return 0
    return run_and_report(sweep, args.json)


def run_and_report(sweep: Sweep, as_json: bool) -> int:
    """Run a sweep, write its report, print its outcome; exit code 1 if a run is missing."""
    outcome = run_sweep(sweep)
    report_sweep(outcome)
    print(outcome_json(outcome) if as_json else format_outcome(outcome))
    return 0 if outcome.completed == len(outcome.plan) else 1
