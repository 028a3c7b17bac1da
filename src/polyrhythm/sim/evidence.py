"""What the store's runs say staleness costs, for the advisor: each asynchronous strategy's
completed runs of the advised model and data against the synchronous runs alike, and the
judgement of one option that follows, naming the runs it rests on; without such runs, the
documents' figures, saying there was none.

A run judges an option only if it had at least the option's workers: staleness grows with
the workers, so a run of 2 says little of 8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from polyrhythm.metrics.records import STORE_NAME, config_fields
from polyrhythm.metrics.store import RunStore

SYNCHRONOUS = {"bsp", "allreduce", "ring", "tree", "reduce-broadcast"}
STALE = 1.0  # mean staleness above which a strategy is flagged without stored evidence
LOSS = 0.5  # points of accuracy lost against synchronous runs that flag a strategy
# The documents' word on asynchronous updates, when no stored run judges them.
DOCUMENTED = ("asynchronous updates cost accuracy (the Strategy-Switch thesis: asynchronous "
              "PS -0.9 to -2.9 points)")


@dataclass(frozen=True)
class StoredRun:
    """A completed run of the advised model and data: its final validation accuracy and,
    for an asynchronous one, the mean accuracy of the synchronous runs alike (the same
    workers, epochs and batch) and their ids; None where there is none."""

    run_id: str
    strategy: str
    workers: int
    epochs: int
    accuracy: float
    baseline: float | None = None
    baseline_ids: tuple[str, ...] = ()

    @property
    def synchronous(self) -> bool:
        return self.strategy in SYNCHRONOUS

    @property
    def points(self) -> float | None:
        """Its accuracy against the synchronous runs alike, in points (negative: lost)."""
        return None if self.baseline is None else 100 * (self.accuracy - self.baseline)


@dataclass(frozen=True)
class Judgement:
    """What is known of an option's accuracy: a line (empty: nothing to say), whether it
    cautions against the option, and the stored runs it rests on."""

    text: str = ""
    caution: bool = False
    run_ids: tuple[str, ...] = ()


def stored_runs(out: str | Path, model: str, dataset: str) -> list[StoredRun]:
    """The completed runs of `model` on `dataset` in the store under `out`, oldest first.
    Runs of emulated compute are left out: they learn nothing (their gradients are zeros)."""
    path = Path(out) / STORE_NAME
    if not path.exists():
        return []
    rows = []
    for row in RunStore(path).runs():
        fields = config_fields(row["config"])
        if (row["status"] == "completed" and row["final_val_accuracy"] is not None
                and (row["model"], row["dataset"]) == (model, dataset)
                and fields.get("compute") != "emulated"):
            rows.append((row, (row["workers"], row["epochs"], fields.get("batch_size"))))
    found = []
    for row, alike in rows:
        baseline = [r for r, key in rows if key == alike and r["strategy"] in SYNCHRONOUS]
        run = StoredRun(row["run_id"], row["strategy"], row["workers"], row["epochs"],
                        row["final_val_accuracy"])
        if baseline and not run.synchronous:
            run = replace(run, baseline=sum(r["final_val_accuracy"] for r in baseline)
                          / len(baseline), baseline_ids=tuple(r["run_id"] for r in baseline))
        found.append(run)
    return found


def judge(strategy: str, workers: int, staleness: float,
          runs: Sequence[StoredRun]) -> Judgement:
    """What the stored runs (else the documents) say of `strategy` at `workers` workers and
    its predicted mean `staleness`."""
    if strategy in SYNCHRONOUS:
        return Judgement()
    judging = [r for r in runs if r.strategy == strategy and r.points is not None
               and r.workers >= workers]
    if judging:
        points = sum(r.points for r in judging) / len(judging)
        ids = tuple(dict.fromkeys(i for r in judging for i in (r.run_id, *r.baseline_ids)))
        which = f"{len(judging)} stored run{'s' * (len(judging) > 1)} of {workers}+ workers"
        if points < -LOSS:
            return Judgement(f"{which}: {points:+.1f} points vs synchronous", True, ids)
        return Judgement(f"{which}: {points:+.1f} points vs synchronous, no loss beyond "
                         f"{LOSS}", False, ids)
    unjudged = f"no stored run of {workers}+ workers to judge"
    if strategy == "localsgd":
        return Judgement(f"models drift apart between averagings (tau 4 local steps); "
                         f"{unjudged}", True)
    if staleness > STALE:
        return Judgement(f"staleness {staleness:.1f}: {DOCUMENTED}; {unjudged}", True)
    return Judgement()
