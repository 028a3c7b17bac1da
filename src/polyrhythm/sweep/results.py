"""What a sweep tells: its plan, its outcome (text or JSON), its report, and which runs a
`polyrhythm report` target names."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from polyrhythm.errors import ConfigError, PolyrhythmError, StoreError
from polyrhythm.files import checked_name
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RunStore
from polyrhythm.sweep.plan import Sweep
from polyrhythm.sweep.runner import Outcome
from polyrhythm.sweep.store import SweepStore


def format_plan(sweep: Sweep) -> str:
    """The runs a sweep would make, and which of them an earlier start completed."""
    plan = sweep.plan()
    done = SweepStore(sweep.store_path).completed(sweep.sweep_id)
    lines = [f"sweep {sweep.sweep_id}: {count(len(sweep.points), 'point')} x "
             f"{count(sweep.repeats, 'repeat')} = "
             f"{len(plan)} runs into {sweep.out}"]
    for i, run in enumerate(plan, 1):
        state = "completed" if (run.point.key, run.repeat) in done else "to run"
        lines.append(f"  [{i}/{len(plan)}] {run.label}: {state}")
    return "\n".join(lines)


def format_outcome(outcome: Outcome) -> str:
    """The sweep's end: counts, a line per point over its completed runs, the failures."""
    sweep = outcome.sweep
    failed = len(outcome.plan) - outcome.completed
    lines = [f"sweep {sweep.sweep_id}: {len(outcome.plan)} runs, {outcome.completed} completed"
             f" ({outcome.earlier} earlier), {failed} failed or missing"]
    store = SweepStore(sweep.store_path)
    rows = {r["run_id"]: r for r in store.runs()}
    done = store.completed(sweep.sweep_id)
    width = max(len(p.label) for p in sweep.points)
    lines.append(f"  {'point':<{width}} {'runs':>4} {'val acc':>8} {'(min-max)':>15} "
                 f"{'samples/s':>10} {'wall s':>7}")
    for point in sweep.points:
        got = [rows[done[(point.key, r)]] for r in range(sweep.repeats)
               if (point.key, r) in done and done[(point.key, r)] in rows]
        if not got:
            lines.append(f"  {point.label:<{width}} {0:>4}")
            continue
        # None: a loss without accuracy (mse)
        acc = [g["final_val_accuracy"] for g in got if g["final_val_accuracy"] is not None]
        spread = f"({min(acc):.4f}-{max(acc):.4f})" if len(acc) > 1 else ""
        mean = f"{_mean(acc):.4f}" if acc else "-"
        lines.append(f"  {point.label:<{width}} {len(got):>4} {mean:>8} {spread:>15} "
                     f"{_mean([g['samples_per_s'] for g in got]):>10.0f} "
                     f"{_mean([g['wall_s'] for g in got]):>7.1f}")
    if outcome.failures:
        lines.append("failed:")
        lines += [f"  {label}: {error}" for label, error in outcome.failures]
    if outcome.report is not None:
        lines.append(f"report: {outcome.report}")
    elif outcome.report_note:
        lines.append(outcome.report_note)
    return "\n".join(lines)


def count(n: int, noun: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def outcome_json(outcome: Outcome) -> str:
    return json.dumps({
        "sweep_id": outcome.sweep.sweep_id, "name": outcome.sweep.name,
        "runs": len(outcome.plan), "completed": outcome.completed, "earlier": outcome.earlier,
        "ran": outcome.ran, "failed": len(outcome.failures), "run_ids": outcome.run_ids,
        "failures": [{"run": label, "error": error} for label, error in outcome.failures],
        "report": str(outcome.report) if outcome.report else None})


def report_writer() -> tuple[Callable[..., Path] | None, str]:
    """polyrhythm.report.write_report, or None and why it cannot be imported."""
    try:
        from polyrhythm.report import write_report
    except ImportError as exc:
        return None, f"cannot import polyrhythm.report ({exc})"
    return write_report, ""


def report_sweep(outcome: Outcome) -> None:
    """Write the sweep's HTML report into <out>/sweeps/<id>/, or say why not."""
    sweep = outcome.sweep
    write, why = report_writer()
    if write is None:
        outcome.report_note = f"report skipped: {why}"
    elif not outcome.run_ids:
        outcome.report_note = "report skipped: no completed runs"
    else:
        title = _title(sweep.name, sweep.description)
        try:
            outcome.report = write(sweep.store_path, outcome.run_ids, sweep.dir, title,
                                   fmt="html")
        except PolyrhythmError as exc:
            outcome.report_note = f"report not written: {exc}"


def report_target(out: str | Path, run_ids: list[str], sweep_id: str | None,
                  latest: bool) -> tuple[str, str, list[str]]:
    """(report name, title, run ids) for `polyrhythm report`; ConfigError for unknown ids."""
    path = Path(out) / STORE_NAME
    if not path.exists():
        raise ConfigError(f"no run store at {str(path)!r}")
    if run_ids:
        stored = {r["run_id"] for r in RunStore(path).runs()}
        unknown = [r for r in run_ids if r not in stored]
        if unknown:
            raise ConfigError(f"unknown run id {unknown[0]!r} in {str(path)!r}")
        run_ids = list(dict.fromkeys(run_ids))
        if len(run_ids) == 1:  # the report's folder is named by the run's id
            return checked_name(run_ids[0], "run id", StoreError), f"run {run_ids[0]}", run_ids
        name = f"runs-{datetime.now(UTC):%Y%m%d-%H%M%S}"
        return name, f"{len(run_ids)} runs", run_ids
    sweeps = SweepStore(path)
    if latest:
        rows = sweeps.sweeps()
        if not rows:
            raise ConfigError(f"no sweep or comparison stored in {str(path)!r}")
        sweep_id = rows[0]["sweep_id"]
    row = sweeps.sweep(sweep_id)
    # The report's folder is named by the sweep's id, as the store holds it: one folder's
    # name, never a path out of the reports folder.
    checked_name(row["sweep_id"], "sweep id", StoreError)
    ids = sweeps.run_ids(sweep_id)
    if not ids:
        raise ConfigError(f"sweep {sweep_id!r} has no completed runs")
    return sweep_id, _title(row["name"], row["description"]), ids


def _title(name: str, description: str) -> str:
    """A sweep report's title: its name, then its description if it has one."""
    return f"{name}: {description}" if description else name
