"""The cluster path: torchrun starts the ranks, polyrhythm.node plays them."""

import json
import shutil
import subprocess
import sys

import psutil
import pytest
import torch

import polyrhythm
from helpers import HANG_GUARD_S, finished, max_diff, stored_parameters, wait_for_checkpoint
from polyrhythm.config import make_config
from polyrhythm.metrics.store import RunStore
from polyrhythm.runtime.checkpoint import complete_epochs, epoch_dir


def test_torchrun_runs_a_bsp_job_and_stores_it(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'strategy = "bsp"\nworkers = 2\nservers = 1\nepochs = 2\n'
                      f'steps_per_epoch = 15\nout = "{tmp_path / "runs"}"\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "3", "-m", "polyrhythm.node", str(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    assert (summary["workers"], summary["servers"]) == (2, 1)
    assert summary["weight_updates"] == 30
    (run,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    assert run["status"] == "completed" and run["run_id"] == summary["run_id"]
    assert len(RunStore(tmp_path / "runs" / "polyrhythm.db").epochs(run["run_id"])) == 2
    state = torch.load(tmp_path / "runs" / run["run_id"] / "model.pt", weights_only=True)
    assert summary["final_val_accuracy"] > 0.5 and len(state) == 8


def test_torchrun_with_the_wrong_process_count_is_one_clear_error(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'workers = 2\nservers = 1\nout = "{tmp_path / "runs"}"\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "polyrhythm.node", str(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "torchrun started 2 processes but the config needs 3" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_nodes_run_the_job_ranks_their_placement_gives_them(monkeypatch):
    from polyrhythm.config import make_config
    from polyrhythm.errors import ConfigError
    from polyrhythm.launch.rank.torchrun import host_of_this_rank

    config = make_config({"strategy": "bsp", "workers": 4, "hosts": 2,
                          "placement": "collocated"})  # 2 servers, one beside each half
    for node, expected in ((0, [0, 2, 3]), (1, [1, 4, 5])):
        monkeypatch.setenv("GROUP_RANK", str(node))
        monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
        assert host_of_this_rank(config) == expected
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="started 4 processes on node 1 but the config "
                                          "places 3 there"):
        host_of_this_rank(config)
    monkeypatch.setenv("GROUP_WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="torchrun started 3 nodes but the config places "
                                          "the job on 2 hosts"):
        host_of_this_rank(config)


def test_a_failed_torchrun_job_resumed_with_torchrun_ends_as_an_uninterrupted_run(tmp_path):
    """bsp under torchrun, a worker killed after the checkpoint of epoch 2 of 4 (rank 0
    records the failure); the same torchrun line with `--resume RUN_ID` on the run's stored
    config goes on in the same record and ends where an uninterrupted run ends."""
    out = tmp_path / "runs"
    fields = {"strategy": "bsp", "workers": 2, "servers": 1, "epochs": 4, "dataset": "digits",
              "steps_per_epoch": 10, "threads": 1, "worker_delay_s": [0.03, 0.03],
              "lr_decay_every": 1, "lr_decay": 0.5}
    config = tmp_path / "run.toml"
    config.write_text(make_config({**fields, "out": str(out)}).to_toml())
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "3", "-m", "polyrhythm.node"]
    launcher = subprocess.Popen([*torchrun, str(config)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    run_dir, _ = wait_for_checkpoint(out, launcher, 2, 1, epochs=2)
    worker = next(p for p in psutil.Process(launcher.pid).children(recursive=True)
                  if p.environ().get("RANK") == "2")
    worker.kill()
    finished(launcher, "after a worker was killed")
    assert launcher.returncode != 0
    assert RunStore(out / "polyrhythm.db").run(run_dir.name)["status"] == "failed"
    for later in complete_epochs(run_dir, 2, 1):  # the kill may have come later
        if later > 2:
            shutil.rmtree(epoch_dir(run_dir, later))
    done = subprocess.run([*torchrun, str(run_dir / "config.toml"), "--resume", run_dir.name],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming run {run_dir.name} after epoch 2 of 4" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == run_dir.name and summary["status"] == "completed"
    assert len(RunStore(out / "polyrhythm.db").epochs(run_dir.name)) == 4
    whole = polyrhythm.train({**fields, "out": str(tmp_path / "whole")})
    assert max_diff(stored_parameters(summary), stored_parameters(whole)) <= 1e-5
    # Resuming it again is refused in one line: it has completed.
    again = subprocess.run([*torchrun, str(run_dir / "config.toml"), "--resume", run_dir.name],
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert again.returncode != 0 and "is completed: only a failed" in again.stderr
