"""Turn the reports gathered from every rank into the run's result: summary, epochs, model."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression.wire import wire_ratio
from polyrhythm.config.emulation import host_ranks
from polyrhythm.data.source import Dataset
from polyrhythm.flat import FlatParameters, RunningStatistics
from polyrhythm.losses import LOSSES
from polyrhythm.metrics.recorder import SPAN_NAMES, StalenessLog
from polyrhythm.metrics.schema import RULE_FIELDS, SERIES
from polyrhythm.models.build import build_model
from polyrhythm.runtime.validation import evaluate


@dataclass
class RunResult:
    """What rank 0 hands to the run record."""

    summary: dict
    epochs: list[dict]
    state_dict: dict[str, torch.Tensor]
    series: dict[str, list[tuple]]  # event rows for the store (metrics/store.py SERIES)


def summarise(config, reports: list[dict], flat: torch.Tensor, val: Dataset,
              wall_s: float) -> RunResult:
    """Combine per-rank reports; evaluate the final model (its parameters `flat`:
    final_parameters) on the validation set."""
    model = _final_model(config, reports, flat, val)
    return combine(config, reports, model.state_dict(),
                   evaluate(model, val, LOSSES[config.loss]),
                   sum(p.numel() for p in model.parameters()), wall_s)


def combine(config, reports: list[dict], state_dict: dict[str, torch.Tensor],
            final: dict[str, float], parameters: int, wall_s: float,
            classifies: bool | None = None) -> RunResult:
    """The run's result from per-rank reports, its final model (`state_dict`, of
    `parameters` trainable values) and that model's validation figures (`final`: val_loss,
    and val_accuracy where it has one). A run whose loss has no accuracy (mse) has None for
    it; one whose loss has but which did not record it, NaN. `classifies`: whether the run
    has an accuracy at all, where not its config's loss says (a script's: whether it logged
    one)."""
    accuracy = LOSSES[config.loss].classifies if classifies is None else classifies
    workers = sorted((r for r in reports if r["role"] == "worker"), key=lambda r: r["worker"])
    servers = [r for r in reports if r["role"] == "server"]
    staleness = Counter()
    for s in servers:
        staleness.update(s["staleness_histogram"])
    lost = _lost_workers(reports)
    summary = {
        "status": "completed",
        "strategy": config.strategy.name,
        "workers": config.workers,
        "servers": config.servers,
        "epochs": config.epochs,
        "final_val_accuracy": final.get("val_accuracy", math.nan if accuracy else None),
        "final_val_loss": final.get("val_loss", math.nan),
        "parameters": parameters,
        # The trained parameters' shapes in flat order: what a compressor's matrices are cut
        # by, which the simulator sizes PowerSGD's messages with.
        "parameter_shapes": [list(shape) for shape in workers[0]["shapes"]],
        "samples_per_s": sum(_throughput(w["epochs"]) for w in workers),  # cluster total
        "warmup_steps": config.warmup_steps,
        "wall_s": wall_s,
        "weight_updates": _weight_updates(servers, workers),
        "weight_updates_per_server": [s["weight_updates"] for s in servers],
        "update_s_per_server": [s["update_s"] for s in servers],
        "server_momentum": servers[0]["momentum"] if servers else config.optimizer.momentum,
        **StalenessLog.summarise(staleness),
        "per_worker": [_worker_times(w) for w in workers],
        "traffic_per_rank": [{"rank": r["rank"], **r["traffic"]} for r in reports],
        **_strategy_figures(workers),
        "on_worker_failure": config.on_worker_failure,
        "lost_workers": lost,
        "membership": membership_timeline(config, lost),
        "compression": _compression(config, workers, servers),
    }
    series = {"iterations": [row for w in workers for row in w["iterations"]],
              "pushes": [row for s in servers for row in s["pushes"]],
              "updates": [row for s in servers for row in s["updates"]],
              "resources": [row for r in reports for row in r.get("resources", [])],
              "membership": [tuple(event[c] for c in SERIES["membership"])
                             for event in summary["membership"]]}
    return RunResult(summary, _epoch_rows(workers, accuracy), state_dict, series)


def final_parameters(reports: list[dict]) -> torch.Tensor:
    """The run's final flat parameters, from every rank's report: the servers' shards in
    order, or where no server holds the model the first worker's (the workers' consensus,
    where they average). A built-in job's and a script's alike."""
    shards = sorted((r["shard"] for r in reports if "shard" in r), key=lambda s: s[0])
    return torch.cat([values for _, _, values in shards])


def _final_model(config, reports: list[dict], flat: torch.Tensor,
                 val: Dataset) -> torch.nn.Module:
    """The model of parameters `flat`, with the workers' mean running statistics."""
    model = build_model(config.model, val.shape, val.classes, config.seed, config.loss)
    FlatParameters(model).data.copy_(flat)
    for r in reports:
        if "statistics" in r:
            RunningStatistics(model).set(r["statistics"])
    return model


def _seconds(worker: dict) -> float:
    return sum(e["seconds"] for e in worker["epochs"])


def _throughput(epochs: list[dict]) -> float:
    """Samples/s after the warm-up steps (all steps if the warm-up took every one)."""
    samples = sum(e["measured_samples"] for e in epochs)
    seconds = sum(e["measured_seconds"] for e in epochs)
    if samples == 0 or seconds <= 0:
        samples, seconds = sum(e["samples"] for e in epochs), sum(e["seconds"] for e in epochs)
    return samples / seconds if samples else 0.0  # no steps: a worker stopped early


def _weight_updates(servers: list[dict], workers: list[dict]) -> int:
    """Updates applied to the model: per shard on servers (all shards agree), else one a step."""
    if servers:
        return max(s["weight_updates"] for s in servers)
    return workers[0]["steps"]


def _strategy_figures(workers: list[dict]) -> dict:
    """What the strategy adds to the summary (Strategy.summary): worker 0's figures, but the
    switch's time as the slowest worker's."""
    figures = dict(workers[0]["strategy"])
    if figures.get("switch_s") is not None:
        figures["switch_s"] = max(w["strategy"]["switch_s"] or 0.0 for w in workers)
    return figures


def _worker_times(worker: dict) -> dict:
    spans, train_s = worker["spans"], _seconds(worker)
    return {"worker": worker["worker"], "steps": worker["steps"], "train_s": train_s,
            "samples_per_s": _throughput(worker["epochs"]),
            **{f"{name}_s": spans.get(name, 0.0) for name in SPAN_NAMES},
            # Share of training time blocked on servers or peers for parameters.
            "idleness": spans.get("wait", 0.0) / train_s if train_s > 0 else 0.0}


def _compression(config, workers: list[dict], servers: list[dict]) -> dict | None:
    """What the run compressed with: the compressor and its settings, whether its error
    feedback was on, the share of the bytes its whole-model message sends (`dense_share`), and the
    seconds every rank spent encoding and decoding (workers', servers')."""
    settings = config.compression
    spec = COMPRESSORS[settings.name]
    if not spec.compresses:
        return None
    return {"compressor": settings.name, **{p.name: settings[p.name] for p in spec.params},
            "error_feedback": spec.error_feedback(settings),
            "compress_replies": settings.compress_replies,
            "dense_share": wire_ratio(settings, workers[0]["shapes"]),
            "compress_s": sum(w["spans"].get("compress", 0.0) for w in workers),
            "server_compress_s": sum(s.get("compress_s", 0.0) for s in servers)}


def _lost_workers(reports: list[dict]) -> list[dict]:
    """The workers lost during the run (on_worker_failure = continue), by index: when a
    server or the workers left first saw each go (None: after its last message, seen only at
    the roll call) and the gradients it had pushed, or summed with them, by then."""
    lost: dict[int, dict] = {}
    for entry in (e for r in reports for e in r.get("lost", ())):
        known = lost.get(entry["worker"])
        if known is None or (entry["at_s"] is not None
                             and (known["at_s"] is None or entry["at_s"] < known["at_s"])):
            lost[entry["worker"]] = entry
    return [lost[w] for w in sorted(lost)]


def membership_timeline(config, lost: list[dict]) -> list[dict]:
    """Each change of the run's workers, in time order (those seen only after training
    last): when, which worker and rank, its emulated host (None: none), the cause and the
    workers the run had after it."""
    hosts = {rank: h for h, ranks in enumerate(host_ranks(config.cluster, config.servers,
                                                          config.workers))
             for rank in ranks} if config.cluster.hosts else {}
    events = sorted(lost, key=lambda e: (e["at_s"] is None, e["at_s"] or 0.0, e["worker"]))
    return [{"t": e["at_s"], "worker": e["worker"], "rank": e["rank"],
             "host": hosts.get(e["rank"]), "cause": "lost", "workers": config.workers - i - 1}
            for i, e in enumerate(events)]


def _epoch_rows(workers: list[dict], accuracy: bool) -> list[dict]:
    """Per epoch: mean train loss over workers (those that took steps in it), first worker's
    validation (its accuracy None where the loss has none), cluster samples/s, and where the
    strategy switches, its phase and its rule's answer after the epoch."""
    rows = []
    for e, first in enumerate(workers[0]["epochs"]):
        per_worker = [w["epochs"][e] for w in workers]
        losses = [p["train_loss"] for p in per_worker if p["samples"]]
        rows.append({
            "epoch": e,
            "train_loss": sum(losses) / len(losses) if losses else math.nan,
            # Not validated: the workers that kept the epochs' models were lost.
            "val_loss": first.get("val_loss", math.nan),
            "val_accuracy": first.get("val_accuracy", math.nan) if accuracy else None,
            "samples_per_s": sum(_throughput([p]) for p in per_worker),
            "wall_s": max(p["wall_s"] for p in per_worker),
            **{key: first.get(key) for key in RULE_FIELDS},
        })
    return rows
