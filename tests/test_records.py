"""What a run leaves behind: directory, store rows, CLI output, config precedence."""

import json
import subprocess
import sys
import tomllib

import torch

import polyrhythm
from polyrhythm.metrics.store import RunStore
from polyrhythm.models.build import build_model

SUMMARY_KEYS = {"run_id", "status", "strategy", "workers", "servers", "epochs",
                "final_val_accuracy", "final_val_loss", "samples_per_s", "wall_s",
                "weight_updates", "staleness_mean", "staleness_max", "run_dir"}


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "polyrhythm.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_train_json_flags_override_the_config_file_and_the_run_is_stored(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text('strategy = "asp"\nworkers = 3\nepochs = 5\ndataset = "digits"\n'
                      "steps_per_epoch = 8\n")
    done = cli("train", "--config", str(config), "--epochs", "2", "--workers", "2",
               "--out", str(tmp_path / "runs"), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary.keys() >= SUMMARY_KEYS
    assert (summary["strategy"], summary["workers"], summary["epochs"]) == ("asp", 2, 2)
    assert summary["weight_updates"] == 2 * 2 * 8
    run_dir = tmp_path / "runs" / summary["run_id"]
    resolved = tomllib.loads((run_dir / "config.toml").read_text())
    assert resolved["servers"] == 1 and resolved["epochs"] == 2 and resolved["workers"] == 2
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == summary["run_id"]

    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    (row,) = store.runs()
    assert row["status"] == "completed"
    assert abs(row["final_val_accuracy"] - summary["final_val_accuracy"]) < 1e-12
    epochs = store.epochs(summary["run_id"])
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert all(0 <= e["val_accuracy"] <= 1 and e["samples_per_s"] > 0 for e in epochs)

    listing = cli("runs", "--out", str(tmp_path / "runs"))
    assert summary["run_id"] in listing.stdout and "completed" in listing.stdout


def test_model_pt_loads_with_weights_only_and_reproduces_final_accuracy(tmp_path):
    summary = polyrhythm.train(dataset="digits", workers=2, epochs=2, out=str(tmp_path))
    state = torch.load(f"{summary['run_dir']}/model.pt", weights_only=True)
    model = build_model("cnn", (1, 8, 8), 10, seed=0)
    model.load_state_dict(state)
    from polyrhythm.runtime.job import whole_data
    from polyrhythm.runtime.validation import evaluate

    _, _, val = whole_data(polyrhythm.RunConfig(dataset="digits"))
    assert abs(evaluate(model, val)["val_accuracy"] - summary["final_val_accuracy"]) < 1e-9


def test_same_seed_same_result_different_seed_different_result(tmp_path):
    runs = [polyrhythm.train(dataset="digits", strategy="allreduce", workers=2, epochs=1,
                             steps_per_epoch=5, seed=s, out=str(tmp_path)) for s in (1, 1, 2)]
    params = [torch.cat([t.reshape(-1) for t in torch.load(
        f"{r['run_dir']}/model.pt", weights_only=True).values()]) for r in runs]
    assert torch.equal(params[0], params[1])
    assert not torch.allclose(params[0], params[2])


def test_runs_on_an_empty_directory_says_so(tmp_path):
    done = cli("runs", "--out", str(tmp_path))
    assert done.returncode == 0 and "no runs stored" in done.stdout


def test_a_resolved_config_can_switch_between_ps_and_allreduce():
    from polyrhythm.api import resolve_config

    bsp = resolve_config({"strategy": "bsp"})
    assert bsp.servers == 1
    assert resolve_config(bsp, strategy="allreduce").servers == 0
    assert resolve_config(resolve_config({"servers": 2}), strategy="asp").servers == 2


def test_a_completed_run_is_never_marked_failed_afterwards(tmp_path):
    from polyrhythm.metrics.records import RunRecord, fail_run

    summary = polyrhythm.train(dataset="digits", workers=1, epochs=1, steps_per_epoch=3,
                               out=str(tmp_path))
    fail_run(RunRecord(tmp_path, summary["run_id"]), "late teardown problem")
    (row,) = RunStore(tmp_path / "polyrhythm.db").runs()
    assert row["status"] == "completed" and row["error"] is None
    assert json.loads((tmp_path / summary["run_id"] / "summary.json").read_text())[
        "status"] == "completed"


def test_unusable_runs_directory_and_corrupt_store_are_one_line_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = cli("train", "--out", str(blocker), "--dataset", "digits")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "cannot" in done.stderr

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "polyrhythm.db").write_text("this is not sqlite")
    done = cli("runs", "--out", str(tmp_path / "bad"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("polyrhythm: error: run store")
