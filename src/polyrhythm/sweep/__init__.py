"""Sweeps: every combination of some run settings, times a number of seeds, resumable.

plan.py reads a sweep file into its points and runs; store.py keeps in the run store which
of them completed; runner.py runs the missing ones; progress.py shows them going;
results.py formats the outcome and resolves report targets.
"""

from polyrhythm.sweep.plan import (
    COMPARE_EPOCHS,
    COMPARE_STRATEGIES,
    PlannedRun,
    Point,
    Sweep,
    compare_sweep,
    expand_grid,
    load_sweep,
    parse_sweep,
)
from polyrhythm.sweep.results import (
    count,
    format_outcome,
    format_plan,
    outcome_json,
    report_sweep,
    report_target,
    report_writer,
)
from polyrhythm.sweep.runner import Outcome, run_sweep
from polyrhythm.sweep.store import SweepStore

__all__ = ["COMPARE_EPOCHS", "COMPARE_STRATEGIES", "Outcome", "PlannedRun", "Point", "Sweep",
           "SweepStore", "compare_sweep", "count", "expand_grid", "format_outcome",
           "format_plan", "load_sweep", "outcome_json", "parse_sweep", "report_sweep",
           "report_target", "report_writer", "run_sweep"]
