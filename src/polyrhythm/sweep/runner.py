"""Running a sweep: its missing runs one after another, each through `polyrhythm.train`; a
failing run does not stop the others, Ctrl-C or SIGTERM stops the sweep where it is."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from polyrhythm.errors import PolyrhythmError, RunFailed, StoreError, one_line
from polyrhythm.sweep.plan import PlannedRun, Sweep
from polyrhythm.sweep.progress import SweepProgress
from polyrhythm.sweep.store import SweepStore


@dataclass
class Outcome:
    """What a sweep run did; `failures` are (run label, one-line error)."""

    sweep: Sweep
    plan: list[PlannedRun]
    earlier: int = 0
    ran: int = 0
    run_ids: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    report: Path | None = None
    report_note: str | None = None

    @property
    def completed(self) -> int:
        return len(self.run_ids)


def run_sweep(sweep: Sweep, *, train: Callable[..., dict] | None = None,
              stream: TextIO | None = None) -> Outcome:
    """Run the sweep's missing runs one after another. A failing run does not stop the
    others; Ctrl-C or SIGTERM stops the sweep (KeyboardInterrupt) with the run in progress
    recorded as failed, to be run again when the sweep is."""
    from polyrhythm.launch.process.signals import signal_handlers

    if train is None:
        from polyrhythm import api
        train = api.train if sweep.script is None else (
            lambda config: api.run_script(sweep.script, sweep.args, config))
    plan = sweep.plan()
    store = SweepStore(sweep.store_path)
    store.begin(sweep, plan)
    _write_sweep_file(sweep)
    done = store.completed(sweep.sweep_id)
    todo = [r for r in plan if (r.point.key, r.repeat) not in done]
    outcome = Outcome(sweep, plan, earlier=len(plan) - len(todo))
    progress = SweepProgress(len(plan), stream or sys.stderr)
    progress.note(f"sweep {sweep.sweep_id}: {len(plan)} runs, "
                  f"{outcome.earlier} completed earlier, {len(todo)} to run")
    stop = _Stop()
    with signal_handlers(sigint=stop, sigterm=stop):
        for run in todo:
            index = plan.index(run) + 1
            store.mark(sweep.sweep_id, run, "running")
            progress.start(index, run.label)
            started = time.monotonic()
            try:
                summary = train(run.config)
            except BaseException as exc:
                interrupted = stop.seen or isinstance(exc, KeyboardInterrupt) or (
                    isinstance(exc, RunFailed) and exc.interrupted)
                error = one_line(exc) or type(exc).__name__
                bug = not interrupted and not isinstance(exc, PolyrhythmError)
                if bug:  # not the run's but ours: its type, and its traceback below
                    error = f"{type(exc).__name__}: {error}"
                store.mark(sweep.sweep_id, run, "failed", getattr(exc, "run_id", None), error)
                if bug:
                    progress.finish(index, run.label, f"failed: {type(exc).__name__}")
                    raise  # a bug: say so with the traceback
                progress.finish(index, run.label, "interrupted" if interrupted
                                else f"failed: {error}")
                if interrupted:
                    progress.note(f"sweep {sweep.sweep_id} stopped; the same command finishes "
                                  "the runs left")
                    raise KeyboardInterrupt from None
                outcome.failures.append((run.label, error))
            else:
                store.mark(sweep.sweep_id, run, "completed", summary["run_id"])
                figure = _figure(summary)
                progress.finish(index, run.label,
                                f"{figure}, {time.monotonic() - started:.1f} s")
            outcome.ran += 1
    outcome.run_ids = store.run_ids(sweep.sweep_id)
    return outcome


def _figure(summary: dict) -> str:
    """A finished run's final figure: its accuracy, else (a loss without accuracy) its
    validation loss; a script may have logged neither."""
    accuracy, loss = summary.get("final_val_accuracy"), summary.get("final_val_loss")
    if accuracy is not None:
        return f"{accuracy:.3f} acc"
    return f"{loss:.4g} val loss" if loss is not None else "no validation logged"


class _Stop:
    """A SIGINT/SIGTERM handler that remembers it was called and stops what runs."""

    seen = False

    def __call__(self, signum, frame) -> None:
        self.seen = True
        raise KeyboardInterrupt


def _write_sweep_file(sweep: Sweep) -> None:
    try:
        sweep.dir.mkdir(parents=True, exist_ok=True)
        (sweep.dir / "sweep.toml").write_text(sweep.to_toml())
    except OSError as exc:
        raise StoreError(f"cannot write {str(sweep.dir)!r}: {exc.strerror}") from None
