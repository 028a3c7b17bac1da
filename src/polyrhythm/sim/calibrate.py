"""Calibration: a stored run's config and measured costs, and what it measured, so the
simulator predicts that run (and its variations) from its own pieces.

From the store (metrics/store.py): the run's config (its cluster's links and latency), the
model's size, each worker's compute seconds per step after the warm-up (divided by the
run's own slowdown and CPU factor, which the simulation puts back), and the servers'
update seconds per weight update (a collective run's: each worker's optimizer step). A
script's run (`polyrhythm run`) is calibrated alike: its model is the script's flat model,
its compute each step's time between the script's optimizer steps, and its global batch
the workers' loaders' (its summary's `batch_size`), not the config's. The
reduce cost R_w is not measured apart: the servers' update spans leave the adding of pushes
out, which is small next to the links the simulator is for. Under compression: the
parameters' shapes (its summary's), each worker's mean seconds per step encoding and decoding
after the warm-up (the iterations' compress_s), and the servers' per whole-model push they
decoded (their compress seconds over the pushes they took, a bucket's push a share).

An emulated run's hosts share this machine's cores: it trains no faster than those cores
allow (cores_bound, samples/s), the machine's cores over the CPU seconds its hosts' threads
ran per sample trained (the fidelity guard's used cores, launch/cluster/fidelity.py). The simulator
models hosts of their own; where a run was emulator-bound, the bound is what it could reach
here (study.Prediction).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from polyrhythm.config import RunConfig, make_config
from polyrhythm.errors import StoreError, one_line
from polyrhythm.files import shown
from polyrhythm.layout import BucketLayout
from polyrhythm.metrics.records import completed_run, compute_series, config_fields
from polyrhythm.sim.compressed import settings_key
from polyrhythm.sim.setup import Costs, compute_stretch


@dataclass(frozen=True)
class Calibration:
    """A stored run as the simulator sees it: its config and costs, and its measurements
    (cluster samples/s, mean idleness), against which a prediction is judged."""

    run_id: str
    config: RunConfig
    costs: Costs
    iterations: int
    measured: dict
    cores_bound: float | None = None  # samples/s: an emulated run's, its machine's cores

    def to_dict(self) -> dict:
        """Plain values: a test fixture holds these (tests/fixtures/sim/)."""
        return {"run_id": self.run_id, "config": self.config.to_dict(),
                "costs": vars(self.costs), "iterations": self.iterations,
                "measured": self.measured, "cores_bound": self.cores_bound}

    @classmethod
    def from_dict(cls, values: dict) -> Calibration:
        return cls(values["run_id"], RunConfig(**values["config"]), Costs(**values["costs"]),
                   values["iterations"], values["measured"], values.get("cores_bound"))


# The fields of a stored summary that size the simulation's work: a damaged store's would
# make it endless (a count of 10^18 steps, servers or parameters). No run this library
# stores comes near these.
SIZES = {"warmup_steps": 2**40, "servers": 2**20, "parameters": 2**36}


def calibrate(out: str | Path, run_id: str) -> Calibration:
    """The calibration of completed run `run_id` of the store under `out`; a one-line
    StoreError if what the store holds of it is not what a run records."""
    store, row = completed_run(out, run_id, "--calibrate")
    summary = _summary(row, run_id)
    try:
        return _calibration(out, run_id, store, row, summary)
    # A field missing from the summary polyrhythm wrote, or of another kind: a damaged store.
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise StoreError(f"--calibrate: run {run_id}'s stored summary is damaged "
                         f"({type(exc).__name__}: {one_line(exc)})") from None


def _summary(row: dict, run_id: str) -> dict:
    """A completed run's stored summary, its sizes checked (SIZES)."""
    try:
        summary = json.loads(row["summary"] or "")
    except (ValueError, RecursionError):
        summary = None
    if not isinstance(summary, dict):
        raise StoreError(f"--calibrate: run {run_id}'s stored summary is not a JSON object")
    for key, most in SIZES.items():
        value = summary.get(key)
        if type(value) is not int or not 0 <= value <= most:
            raise StoreError(f"--calibrate: run {run_id}'s stored summary is damaged: "
                             f"{key} is {shown(value)}, not a whole number up to {most:,}")
    return summary


def _calibration(out: str | Path, run_id: str, store, row: dict, summary: dict) -> Calibration:
    config = make_config({**config_fields(row["config"], run_id), "out": str(out),
                          **_script_batch(summary, run_id)})
    warmup = summary["warmup_steps"]
    # Stored unstretched: the simulation stretches them again by the simulated config's
    # slowdowns and CPU shares, which for this run's own config gives them back as measured.
    stretch = compute_stretch(config)
    rows = store.series("iterations", run_id)
    compute = [[t / stretch[w] for t in times[warmup:] or times]
               for w, times in enumerate(compute_series(rows, row, "--calibrate"))]
    workers = summary["per_worker"]
    steps = max(w["steps"] for w in workers)
    if not 0 < steps <= len(rows):  # a step is an iteration row, at least one per step
        raise ValueError(f"{steps} steps for {len(rows)} iteration rows")
    if summary["servers"]:
        update_s = sum(summary["update_s_per_server"]) / max(1, summary["weight_updates"])
    else:
        update_s = sum(w["apply_s"] for w in workers) / max(1, sum(w["steps"] for w in workers))
    message_s = _message_s(rows, warmup) if summary["servers"] else 0.0
    measured = {"samples_per_s": _measured(summary["samples_per_s"]),
                "idleness": sum(_measured(w["idleness"]) for w in workers) / len(workers),
                "staleness_mean": _measured(summary["staleness_mean"])}
    after = [row["compress_s"] for row in rows if row["step"] >= warmup] or [
        row["compress_s"] for row in rows]
    costs = Costs(summary["parameters"], update_s, 0.0, compute, message_s,
                  shapes=summary.get("parameter_shapes", []),
                  compressor=settings_key(config.compression),
                  compress_s=sum(after) / max(1, len(after)),
                  server_compress_s=_server_compress_s(config, summary, store, run_id))
    return Calibration(run_id, config, costs, steps, measured, cores_bound(summary))


def _measured(value) -> float:
    """A number the run measured, as stored; ValueError (a damaged summary) if it is not."""
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{shown(value)} is no measurement")
    return value


def cores_bound(summary: dict) -> float | None:
    """The samples/s an emulated run's machine allows: its cores over the CPU seconds the
    hosts' threads ran per sample (the mean cores they used over the samples/s trained);
    None for a run on real hosts or too short for the fidelity guard to sample."""
    cluster = summary.get("cluster") or {}
    used = sum(host["used_cores"] for host in cluster.get("hosts", []))
    if not cluster.get("samples") or not used or not summary["samples_per_s"]:
        return None
    return cluster["machine_cores"] / (used / summary["samples_per_s"])


def _server_compress_s(config, summary: dict, store, run_id: str) -> float | None:
    """The servers' seconds decoding (and with compressed replies encoding) per whole-model
    push: their compress seconds over the pushes they took (the pushes table: a row a
    bucket's push), None for a run without servers or compression."""
    compression = summary.get("compression")
    if not summary["servers"] or not compression:
        return None
    buckets = len(BucketLayout(summary["parameters"], summary["servers"],
                               config.bucket_kb).buckets)
    pushes = len(store.series("pushes", run_id)) / buckets
    return compression["server_compress_s"] / pushes if pushes else None


def _script_batch(summary: dict, run_id: str) -> dict:
    """A script's global batch, in place of its config's; {} for polyrhythm train's runs."""
    if "script" not in summary:
        return {}
    if not summary.get("batch_size"):  # a run recorded before scripts kept it, or no loader
        raise StoreError(f"--calibrate: run {run_id} recorded no batch size (its script "
                         "made no job.loader), so its steps' samples are unknown")
    return {"batch_size": summary["batch_size"]}


def _message_s(rows: list, warmup: int) -> float:
    """A message's own cost to its process (LogP's o): half a parameter-server worker's
    time per step to hand its last push over and take the reply in (its push and pull
    spans), the median over the steps after the warm-up."""
    spans = sorted(row["push_s"] + row["pull_s"] for row in rows if row["step"] >= warmup)
    return spans[len(spans) // 2] / 2 if spans else 0.0
