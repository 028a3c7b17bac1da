"""What the store's runs say staleness and compression cost, for the advisor: each
asynchronous strategy's uncompressed runs of the advised model and data against the
synchronous uncompressed runs alike, each compressed run against the uncompressed runs of its
own strategy alike, and the judgement of one option that follows, naming the runs it rests
on; without such runs, the documents' figures for staleness and, for a compressor, that its
cost is unknown, saying there was none.

A run judges an option only if it had at least the option's workers: staleness grows with
the workers, so a run of 2 says little of 8; a compressor's cost is held to the same rule.
Runs alike have the same workers, epochs and batch; a compressor is judged by runs of the
same compressor with the same settings (sim/compressed.py codec_key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from polyrhythm.compression import NONE
from polyrhythm.metrics.records import STORE_NAME, config_fields
from polyrhythm.metrics.store import RunStore
from polyrhythm.sim.compressed import codec_key

SYNCHRONOUS = {"bsp", "allreduce", "ring", "tree", "reduce-broadcast"}
STALE = 1.0  # mean staleness above which a strategy is flagged without stored evidence
LOSS = 0.5  # points of accuracy lost against synchronous runs that flag a strategy
# The documents' word on asynchronous updates, when no stored run judges them.
DOCUMENTED = ("asynchronous updates cost accuracy (the Strategy-Switch thesis: asynchronous "
              "PS -0.9 to -2.9 points)")


@dataclass(frozen=True)
class StoredRun:
    """A completed run of the advised model and data: its final validation accuracy and,
    for an uncompressed asynchronous one, the mean accuracy of the synchronous uncompressed
    runs alike (the same workers, epochs and batch) and their ids; for a compressed one
    (`compressor`, codec_key), the mean accuracy of the uncompressed runs of its strategy
    alike (`dense`) and their ids; None where there is none."""

    run_id: str
    strategy: str
    workers: int
    epochs: int
    accuracy: float
    baseline: float | None = None
    baseline_ids: tuple[str, ...] = ()
    compressor: str = NONE
    dense: float | None = None
    dense_ids: tuple[str, ...] = ()

    @property
    def synchronous(self) -> bool:
        return self.strategy in SYNCHRONOUS

    @property
    def points(self) -> float | None:
        """Its accuracy against the synchronous runs alike, in points (negative: lost)."""
        return None if self.baseline is None else 100 * (self.accuracy - self.baseline)

    @property
    def compression_points(self) -> float | None:
        """Its accuracy against its strategy's uncompressed runs alike, in points."""
        return None if self.dense is None else 100 * (self.accuracy - self.dense)


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
        fields = config_fields(row["config"], row["run_id"])
        if (row["status"] == "completed" and row["final_val_accuracy"] is not None
                and (row["model"], row["dataset"]) == (model, dataset)
                and fields.get("compute") != "emulated"):
            rows.append((row, (row["workers"], row["epochs"], fields.get("batch_size")),
                         codec_key(fields.get("compress", NONE), fields)))
    found = []
    for row, alike, compressor in rows:
        dense = [r for r, key, c in rows if key == alike and c == NONE]
        run = StoredRun(row["run_id"], row["strategy"], row["workers"], row["epochs"],
                        row["final_val_accuracy"], compressor=compressor)
        baseline = [r for r in dense if r["strategy"] in SYNCHRONOUS]
        ours = [r for r in dense if r["strategy"] == run.strategy]
        if compressor == NONE and baseline and not run.synchronous:
            run = replace(run, baseline=_mean(baseline), baseline_ids=_ids(baseline))
        elif compressor != NONE and ours:
            run = replace(run, dense=_mean(ours), dense_ids=_ids(ours))
        found.append(run)
    return found


def _mean(rows: list) -> float:
    return sum(r["final_val_accuracy"] for r in rows) / len(rows)


def _ids(rows: list) -> tuple[str, ...]:
    return tuple(r["run_id"] for r in rows)


def judge(strategy: str, workers: int, staleness: float, runs: Sequence[StoredRun],
          compressor: str = NONE) -> Judgement:
    """What the stored runs (else the documents) say of `strategy` at `workers` workers, its
    predicted mean `staleness`, and its `compressor` (codec_key): both judgements, in a
    line each joined by "; ", cautioning where either does."""
    said = _staleness(strategy, workers, staleness, runs)
    if compressor == NONE:
        return said
    cost = _compression(strategy, workers, compressor, runs)
    return Judgement("; ".join(t for t in (said.text, cost.text) if t),
                     said.caution or cost.caution,
                     tuple(dict.fromkeys((*said.run_ids, *cost.run_ids))))


def _by_runs(judging: list[StoredRun], workers: int, points: list[float], versus: str,
             ids: list[tuple[str, ...]]) -> Judgement:
    """The judgement of the runs `judging`, each `points` off the runs `ids` (its own and
    its baselines'), against `versus`."""
    mean = sum(points) / len(points)
    which = f"{len(judging)} stored run{'s' * (len(judging) > 1)} of {workers}+ workers"
    run_ids = tuple(dict.fromkeys(i for r, own in zip(judging, ids, strict=True)
                                  for i in (r.run_id, *own)))
    if mean < -LOSS:
        return Judgement(f"{which}: {mean:+.1f} points vs {versus}", True, run_ids)
    return Judgement(f"{which}: {mean:+.1f} points vs {versus}, no loss beyond {LOSS}", False,
                     run_ids)


def _compression(strategy: str, workers: int, compressor: str,
                 runs: Sequence[StoredRun]) -> Judgement:
    judging = [r for r in runs if r.strategy == strategy and r.compressor == compressor
               and r.compression_points is not None and r.workers >= workers]
    if judging:
        said = _by_runs(judging, workers, [r.compression_points for r in judging],
                        f"{strategy} uncompressed", [r.dense_ids for r in judging])
        return replace(said, text=f"{compressor}: {said.text}")
    return Judgement(f"{compressor}: accuracy cost unknown, no stored run of {strategy} of "
                     f"{workers}+ workers with it and without it to judge", True)


def _staleness(strategy: str, workers: int, staleness: float,
               runs: Sequence[StoredRun]) -> Judgement:
    if strategy in SYNCHRONOUS:
        return Judgement()
    judging = [r for r in runs if r.strategy == strategy and r.points is not None
               and r.workers >= workers]
    if judging:
        return _by_runs(judging, workers, [r.points for r in judging], "synchronous",
                        [r.baseline_ids for r in judging])
    unjudged = f"no stored run of {workers}+ workers to judge"
    if strategy == "localsgd":
        return Judgement(f"models drift apart between averagings (tau 4 local steps); "
                         f"{unjudged}", True)
    if staleness > STALE:
        return Judgement(f"staleness {staleness:.1f}: {DOCUMENTED}; {unjudged}", True)
    return Judgement()
