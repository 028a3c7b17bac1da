"""The report's tables as text cells, for the HTML and the Markdown writers alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.report.compression import compressed, compression_points
from polyrhythm.report.data import Group, Run
from polyrhythm.report.measures import (
    Stats,
    final_accuracy,
    idleness,
    staleness_mean,
    stats,
    throughput,
    time_to_accuracy,
    wall_time,
    weight_updates,
)
from polyrhythm.report.system import breakdown

NONE = "–"


@dataclass(frozen=True)
class Table:
    id: str
    title: str
    caption: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]


def _num(value: float | None, digits: int = 0) -> str:
    return NONE if value is None else f"{value:,.{digits}f}"


def _percent(value: float | None) -> str:
    return NONE if value is None else f"{100 * value:.2f}"


def _mean_std(s: Stats | None, digits: int, scale: float = 1.0) -> str:
    if s is None:
        return NONE
    text = f"{s.mean * scale:,.{digits}f}"
    return text + (f" ± {s.std * scale:,.{digits}f}" if s.n > 1 else "")


def _range(s: Stats | None, digits: int, scale: float = 1.0) -> str:
    return NONE if s is None else f"{s.min * scale:,.{digits}f} – {s.max * scale:,.{digits}f}"


def runs_table(runs: list[Run]) -> Table:
    rows = []
    for run in runs:
        r = run.row
        rows.append((run.run_id, r["status"], run.label, r["strategy"], str(r["workers"]),
                     str(r["servers"]), str(r["epochs"]), _percent(final_accuracy(run)),
                     _num(throughput(run)), _num(wall_time(run), 1), _num(weight_updates(run)),
                     _num(staleness_mean(run), 2) if run.completed else NONE,
                     r.get("error") or ""))
    return Table("runs-table", "Runs", "Every run the report covers; failed and unfinished "
                 "runs appear here only, not in the figures.",
                 ("run id", "status", "group", "strategy", "workers", "servers", "epochs",
                  "final val acc (%)", "samples/s", "wall (s)", "weight updates",
                  "staleness mean", "error"), rows)


def groups_table(groups: list[Group]) -> Table:
    rows = []
    for g in groups:
        acc = stats(final_accuracy(r) for r in g.runs)
        sps = stats(throughput(r) for r in g.runs)
        wall = stats(wall_time(r) for r in g.runs)
        rows.append((g.label, str(len(g.runs)), _mean_std(acc, 2, 100), _range(acc, 2, 100),
                     _mean_std(sps, 0), _range(sps, 0), _mean_std(wall, 1), _range(wall, 1)))
    return Table("groups-table", "Groups", "Completed runs grouped by strategy and the config "
                 "fields that differ between them (the seed aside): mean ± sample standard "
                 "deviation over repeats, and min – max.",
                 ("group", "runs", "final val acc (%) mean ± std", "final val acc min – max",
                  "samples/s mean ± std", "samples/s min – max", "wall (s) mean ± std",
                  "wall (s) min – max"), rows)


def breakdown_table(groups: list[Group]) -> Table:
    phases = {g.label: ms for g, ms in breakdown(groups)}
    rows = []
    for g in groups:
        ms = phases.get(g.label)
        cells = [_num(np.mean([m[p] for m in ms]) * 1000, 2) if ms else NONE
                 for p in (*SPAN_NAMES, "other")]
        total = stats(sum(m.values()) * 1000 for m in ms) if ms else None
        idle = stats(v for r in g.runs for v in idleness(r))
        rows.append((g.label, *cells, _mean_std(total, 2), _mean_std(idle, 1, 100),
                     _mean_std(stats(weight_updates(r) for r in g.runs), 0),
                     _mean_std(stats(staleness_mean(r) for r in g.runs), 2)))
    return Table("breakdown-table", "Time breakdown", "Per group, means over repeats of the "
                 "milliseconds per iteration in each phase (each worker's warm-up steps left "
                 "out, as in samples/s), idleness (wait / iteration time, over workers), "
                 "weight updates and the mean staleness of applied gradients.",
                 ("group", *(f"{p} (ms)" for p in (*SPAN_NAMES, "other")), "total (ms)",
                  "idleness (%)", "weight updates", "staleness mean"), rows)


def cluster_table(runs: list[Run]) -> Table | None:
    """Per host of each run on an emulated cluster: its ranks, link and CPU share, what it
    used, and whether the emulator starved it (the fidelity guard); None if no run had one."""
    rows = []
    for run in runs:
        cluster = run.summary.get("cluster") if run.completed else None
        if not cluster:
            continue
        for host in cluster["hosts"]:
            h = host["host"]
            verdict = {True: "EMULATOR-BOUND", False: "ok", None: "unknown (too short)"}[
                host["emulator_bound"]]
            rows.append((run.run_id, run.label, str(h),
                         ", ".join(map(str, cluster["layout"][h])),
                         cluster["bandwidth"][h] or "unlimited", _num(host["cpu_share"], 2),
                         _num(host["used_cores"], 2), _num(host["waiting_threads"], 2),
                         _percent(host["starved_fraction"]),
                         _percent(cluster["machine_busy"]), verdict))
    if not rows:
        return None
    return Table("cluster-table", "Emulated cluster and its fidelity", "Per host of each run "
                 "on an emulated cluster, over the training window: its job ranks, link rate "
                 "and CPU share (cores; unlimited hosts count every core), the cores it used "
                 "and its threads waiting to run on average, and the share of half-second "
                 "intervals in which it was starved: the machine saturated (>= 90 % busy) "
                 "while it waited for CPU it had not used (< 90 % of its share). "
                 "EMULATOR-BOUND (starved >= 10 % of the time): this machine, not the "
                 "emulated cluster, set the pace; do not trust that run's timings.",
                 ("run id", "group", "host", "ranks", "link", "cpu share", "used cores",
                  "waiting threads", "starved (%)", "machine busy (%)", "fidelity"), rows)


def switch_table(groups: list[Group]) -> Table | None:
    """Per group of Strategy-Switch runs: when each run switched, how long the switch took
    and the time in each phase; None if no group has one."""
    rows = []
    for g in groups:
        summaries = [r.summary for r in g.runs if "switch_rule" in r.summary]
        if not summaries:
            continue
        epochs = ", ".join(NONE if s["switch_epoch"] is None else str(s["switch_epoch"])
                           for s in summaries)
        switch_s = stats(s["switch_s"] for s in summaries if s["switch_s"] is not None)
        phases = [list(s["phase_s"].items()) for s in summaries]
        (first, _), (then, _) = phases[0]
        rows.append((g.label, summaries[0]["switch_rule"], epochs,
                     _mean_std(switch_s, 3),
                     f"{first} " + _mean_std(stats(p[0][1] for p in phases), 1),
                     f"{then} " + _mean_std(stats(p[1][1] for p in phases), 1)))
    if not rows:
        return None
    return Table("switch-table", "Strategy-Switch", "Per group of switch runs: the rule, the "
                 "epochs completed before each run switched (– : never), the switch's time "
                 "(last synchronous step to first asynchronous push, the slowest worker's) and "
                 "the seconds in each phase, mean ± std over repeats.",
                 ("group", "rule", "switched after epoch", "switch (s)", "first phase (s)",
                  "second phase (s)"), rows)


def compression_table(groups: list[Group]) -> Table | None:
    """Per group: what it compressed with, its bytes per step and final accuracy, and both
    against the uncompressed group of the same settings; None if no run compressed."""
    if not compressed(groups):
        return None
    points = compression_points(groups)
    by_group = {id(p.group): p for p in points}
    rows = []
    for p in points:
        base = by_group.get(id(p.baseline))
        if base is p:
            ratio = delta = "reference"
        else:
            ratio = NONE if not (base and p.bytes and base.bytes) else \
                f"{p.bytes.mean / base.bytes.mean:.3g}"
            delta = NONE if not (base and p.accuracy and base.accuracy) else \
                f"{p.accuracy.mean - base.accuracy.mean:+.2f}"
        share = 1.0 if p.compressor == "none" else p.compression.get("dense_share")
        feedback = p.compression.get("error_feedback")
        rows.append((p.group.label, p.group.strategy, p.compressor,
                     NONE if feedback is None else "on" if feedback else "off",
                     str(len(p.group.runs)), _mean_std(p.bytes, 0), ratio,
                     NONE if share is None else f"{share:.3g}", _mean_std(p.accuracy, 2),
                     delta))
    return Table("compression-table", "Compression", "Per group (see the figure of bytes per "
                 "step against validation accuracy): what it compressed its messages with and "
                 "whether error feedback was on; bytes per step: the bytes every rank sent "
                 "(point to point plus the payload handed to Gloo's own collectives), summed "
                 "over the ranks, over all workers' steps, mean ± std over repeats; the share "
                 "of a dense whole-model message the compressor's arithmetic gives; the final "
                 "validation accuracy, mean ± std; and against the uncompressed group of the "
                 "same strategy and settings (the reference; – where the report has none), "
                 "bytes per step as a multiple of its and the accuracy's difference in "
                 "percentage points.",
                 ("group", "strategy", "compressor", "error feedback", "runs",
                  "bytes per step", "× uncompressed bytes", "message share",
                  "final val acc (%)", "Δ val acc (points)"), rows)


def sharding_table(groups: list[Group]) -> Table | None:
    """Per group: how its data was split, and the run-to-run spread of its final training
    loss and validation accuracy (what better splits are meant to lower); None if no run
    stored a split."""
    rows = []
    for g in groups:
        data = [r.summary["data"] for r in g.runs if r.summary.get("data", {}).get("shards")]
        if not data:
            continue
        sizes = [s["examples"] for s in data[0]["shards"]]
        imbalance = [s["imbalance"] for s in data[0]["shards"]]
        loss = stats(r.epochs[-1]["train_loss"] for r in g.runs if r.epochs)
        acc = stats(final_accuracy(r) for r in g.runs)
        rows.append((g.label, data[0]["sharding"], f"{min(sizes):,} – {max(sizes):,}",
                     _num(data[0]["shards"][0]["copies"]),
                     "∞" if None in imbalance else _num(max(imbalance), 3),
                     _num(max(s["distance"] for s in data[0]["shards"]), 4),
                     _mean_std(loss, 4), _mean_std(acc, 2, 100)))
    if not rows:
        return None
    return Table("sharding-table", "Data sharding", "Per group, its first run's split: "
                 "examples per worker, copies each worker holds, the largest imbalance "
                 "(largest class share over smallest on a worker) and class-mix distance "
                 "(total variation from the whole training set), and over repeats the final "
                 "training loss and validation accuracy, mean ± std.",
                 ("group", "sharding", "examples per worker", "copies", "max imbalance",
                  "max distance", "final train loss", "final val acc (%)"), rows)


def lost_table(runs: list[Run]) -> Table | None:
    """Each worker a run went on without (on_worker_failure = continue); None if none."""
    rows = []
    for run in runs:
        lost = run.summary.get("lost_workers", [])
        for entry in lost:
            rows.append((run.run_id, run.label, str(entry["worker"]),
                         "after its last message" if entry["at_s"] is None
                         else _num(entry["at_s"], 1),
                         _num(entry["pushes"]), str(run.workers - len(lost))))
    if not rows:
        return None
    return Table("lost-table", "Lost workers", "Workers whose process died while the run went "
                 "on without them (on_worker_failure = continue): when the servers, or the "
                 "workers summing with it, saw each go (seconds into training), the gradients "
                 "it had pushed or summed by then, and the workers that finished the run. "
                 "Their figures are left out of the others.",
                 ("run id", "group", "worker", "lost at (s)", "gradients given",
                  "workers left"), rows)


def target_table(groups: list[Group], target: float) -> Table:
    """Per group, how many runs reached `target` validation accuracy and when (the end of
    the first epoch that did, from the job's start): the time to accuracy the studies
    compare strategies by."""
    rows = []
    for g in groups:
        times = [time_to_accuracy(r, target) for r in g.runs]
        reached = [t for t in times if t is not None]
        rows.append((g.label, f"{len(reached)} of {len(times)}",
                     _mean_std(stats(reached), 1), _range(stats(reached), 1),
                     _mean_std(stats(final_accuracy(r) for r in g.runs), 2, 100)))
    return Table("target-table", f"Time to {100 * target:g} % validation accuracy",
                 "Per group, the runs whose validation accuracy reached the target and the "
                 "seconds from the job's start to the end of the first epoch that did (an "
                 "epoch's granularity: validated once an epoch), over those runs.",
                 ("group", "reached", "time to target (s) mean ± std", "min – max",
                  "final val acc (%) mean ± std"), rows)


def tables(runs: list[Run], groups: list[Group], target: float | None = None) -> list[Table]:
    optional = [target_table(groups, target) if target is not None else None,
                cluster_table(runs), switch_table(groups), compression_table(groups),
                sharding_table(groups), lost_table(runs)]
    return [runs_table(runs), groups_table(groups), breakdown_table(groups),
            *(t for t in optional if t is not None)]
