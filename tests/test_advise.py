"""The advisor: its ranking and recommendation, the model sized for the data, its lists, and
the stored runs its flags rest on (named), or the documents' figures when there are none."""

from __future__ import annotations

import json
import re

import pytest

from polyrhythm.config import make_config
from polyrhythm.metrics.store import RunStore


def test_advise_ranks_options_and_recommends_one(advise, tmp_path):
    run = advise("--hosts", "8", "--bandwidth", "100mbit", "--cpu", "1,1,1,1,1,1,1,0.5",
                 "--compute-time", "60ms", "--json", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    header, evidence, *table, recommendation, last = run.stdout.splitlines()
    # The default data (mnist5k, 1x28x28), not 32x32 images (136,874).
    assert header.endswith("model cnn on mnist5k (1x28x28, 10 classes): 105,866 parameters")
    assert evidence.startswith("evidence: no completed run of cnn on mnist5k")
    assert evidence.endswith("the flags below rest on the documents' figures")
    ranked = json.loads(last)
    speeds = [o["samples_per_s"] for o in ranked]
    assert speeds == sorted(speeds, reverse=True) and len(ranked) > 10
    assert all(o["evidence"] == [] for o in ranked)
    best = next(o for o in ranked if not o["caution"])
    assert recommendation.startswith(f"Recommended: {best['option']}")
    assert "expected error ±20 %" in recommendation


def test_advise_sizes_the_model_for_the_data_set_given(advise, tmp_path):
    run = advise("--hosts", "3", "--dataset", "synthetic", "--synthetic-shape", "3", "16",
                 "16", "--synthetic-classes", "4", "--model", "mlp", "--compute-time",
                 "10ms", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    from polyrhythm.models.build import build_model

    count = sum(p.numel() for p in build_model("mlp", (3, 16, 16), 4, 0).parameters())
    assert run.stdout.splitlines()[0].endswith(
        f"model mlp on synthetic (3x16x16, 4 classes): {count:,} parameters")


def test_advise_takes_its_lists_with_spaces_or_commas_and_checks_their_length(advise, tmp_path):
    # No compressor: their codecs are timed here, so two rankings with them differ.
    common = ("--hosts", "4", "--compute-time", "20ms", "--compressors", "none", "--json",
              "--out", str(tmp_path))
    spaced = advise("--cpu", "1", "1", "1", "0.5", "--bandwidth", "100mbit", "50mbit",
                    "100mbit", "50mbit", *common)
    commas = advise("--cpu", "1,1,1,0.5", "--bandwidth", "100mbit,50mbit", "100mbit,50mbit",
                    *common)
    assert spaced.returncode == commas.returncode == 0, spaced.stderr + commas.stderr
    ranked = json.loads(spaced.stdout.splitlines()[-1])
    assert ranked == json.loads(commas.stdout.splitlines()[-1])
    even = advise("--cpu", "1", "--bandwidth", "100mbit", *common)
    assert ranked != json.loads(even.stdout.splitlines()[-1])  # the shares were read
    short = advise("--cpu", "1", "1", "0.5", *common)
    assert short.returncode == 2 and short.stderr.count("\n") == 1
    assert "cpu" in short.stderr and {"3", "4"} <= set(re.findall(r"\b\d+\b", short.stderr))


def _stored(out, run_id: str, strategy: str, workers: int, accuracy: float,
            **fields) -> None:
    """A completed run in the store under `out`, as the launcher records one."""
    config = make_config({"strategy": strategy, "workers": workers, "epochs": 2,
                          "out": str(out), **fields})
    store = RunStore(out / "polyrhythm.db")
    store.add_run(run_id, f"2026-01-01T00:00:{len(store.runs()):02d}+00:00", config.columns(),
                  config.to_toml())
    store.complete_run(run_id, {"final_val_accuracy": accuracy, "samples_per_s": 100.0,
                                "wall_s": 1.0}, [])


def test_advise_names_the_stored_runs_its_flags_rest_on(advise, tmp_path):
    """A run judges an option of its strategy with at least the option's workers, against
    the synchronous runs of its workers, epochs and batch: named as used; the others are
    named as not used; runs of another model or data, or of emulated compute, are none."""
    _stored(tmp_path, "bsp-8", "bsp", 8, 0.93)
    _stored(tmp_path, "asp-8", "asp", 8, 0.90)  # lost 3 points: cautioned against
    _stored(tmp_path, "localsgd-8", "localsgd", 8, 0.929)  # lost 0.1: no loss, said so
    _stored(tmp_path, "asp-2", "asp", 2, 0.95)  # too few workers to judge 8
    _stored(tmp_path, "bsp-2", "bsp", 2, 0.93)
    _stored(tmp_path, "mlp-asp-8", "asp", 8, 0.99, model="mlp")
    _stored(tmp_path, "digits-asp-8", "asp", 8, 0.99, dataset="digits")
    _stored(tmp_path, "sleep-ssp-8", "ssp", 8, 0.99, compute="emulated", compute_time="1ms")
    run = advise("--hosts", "8", "--compute-time", "10ms", "--json", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].startswith("evidence: 3 of the 5 completed runs of cnn on mnist5k")
    shown = {line.split()[1] if line.split()[0] == "used" else line.split()[2]:
             line.split()[0] for line in lines[2:7]}
    assert shown == {"bsp-8": "used", "asp-8": "used", "localsgd-8": "used", "asp-2": "not",
                     "bsp-2": "not"}
    assert "-3.0 points vs synchronous (0.9300)" in lines[3]
    ranked = {o["option"]: o for o in json.loads(lines[-1])}
    asp = ranked["asp, 8 servers on worker hosts"]
    assert asp["caution"] and asp["flag"].startswith("1 stored run of 8+ workers: -3.0 points")
    assert asp["evidence"] == ["asp-8", "bsp-8"]
    local = ranked["localsgd"]
    assert not local["caution"] and "-0.1 points vs synchronous, no loss" in local["flag"]
    ssp = ranked["ssp, 8 servers on worker hosts"]  # its only run slept: no evidence
    assert ssp["caution"] and "no stored run of 8+ workers to judge" in ssp["flag"]
    assert ssp["evidence"] == []
    assert "Recommended: localsgd" in lines[-2]


def test_advise_says_when_its_stored_runs_are_too_small_to_judge(advise, tmp_path):
    _stored(tmp_path, "bsp-2", "bsp", 2, 0.93)
    _stored(tmp_path, "asp-2", "asp", 2, 0.95)
    run = advise("--hosts", "4", "--compute-time", "10ms", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].startswith("evidence: 0 of the 2 completed runs")
    assert lines[4].startswith("  none judges an option")
    assert lines[4].endswith("the flags below rest on the documents' figures")
    asp = next(line for line in lines if "asp, 4 servers" in line)
    assert "no stored run of 4+ workers to judge" in asp


def test_the_advisor_reads_what_staleness_cost_from_the_stores_real_runs(tmp_path):
    import polyrhythm
    from polyrhythm.sim.evidence import stored_runs

    base = {"workers": 2, "epochs": 1, "steps_per_epoch": 10, "dataset": "digits",
            "out": str(tmp_path), "instrumentation": False}
    for strategy in ("bsp", "asp"):
        polyrhythm.train({**base, "strategy": strategy})
    # Emulated compute learns nothing: such a run is no evidence.
    polyrhythm.train({**base, "strategy": "ssp", "compute": "emulated",
                      "compute_time": "1ms"})
    acc = {r["strategy"]: r["final_val_accuracy"] for r in RunStore(
        tmp_path / "polyrhythm.db").runs()}
    runs = {r.strategy: r for r in stored_runs(tmp_path, "cnn", "digits")}
    assert set(runs) == {"bsp", "asp"} and runs["bsp"].points is None
    assert runs["asp"].points == pytest.approx(100 * (acc["asp"] - acc["bsp"]))
    assert stored_runs(tmp_path, "cnn", "mnist5k") == []


@pytest.mark.parametrize("args", [
    ["--hosts", "1"],
    ["--hosts", "4", "--cpu", "a,b"],
    ["--hosts", "4", "--cpu", "1,0", "--compute-time", "1s"],  # a host with no CPU
    ["--hosts", "4", "--cpu", "1,1", "--compute-time", "1s"],  # 2 shares for 4 hosts
    ["--hosts", "4", "--model", "nope", "--compute-time", "1s"],
    ["--hosts", "4", "--bandwidth", "fast", "--compute-time", "1s"],
    ["--hosts", "4", "--compute-time", "soon"],
    ["--hosts", "4", "--calibrate", "no-such-run"],
    ["--hosts", "4", "--dataset", "cifar10"],  # needs --data-path, as train does
    ["--hosts", "4", "--dataset", "synthetic", "--synthetic-shape", "20", "--model",
     "resnet20"],  # images wanted, features given
])
def test_advise_rejects_bad_input_in_one_line(advise, args, tmp_path):
    run = advise(*args, "--out", str(tmp_path))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
