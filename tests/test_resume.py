"""Checkpoints and resume: a run killed part-way and resumed ends where an uninterrupted run
ends; a damaged checkpoint is passed over with a word and set aside; a diverging run stops
as such."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

import polyrhythm
from helpers import (
    HANG_GUARD_S,
    finished,
    flip_tensor_bytes,
    max_diff,
    stored_parameters,
    wait_for_checkpoint,
    wait_for_ranks,
)
from polyrhythm.cli import main
from polyrhythm.config import load_config, make_config
from polyrhythm.errors import DataError, StoreError
from polyrhythm.launch.process import runlock
from polyrhythm.metrics.records import RunRecord, start_run
from polyrhythm.metrics.store import LAUNCHER_GONE, RunStore, process_identity
from polyrhythm.runtime.checkpoint import complete_epochs, epoch_dir

EPOCHS = 4
# The bsp run several tests kill and resume (each a copy of one killed run, `killed`). The
# workers' delay makes every step take a while, so that the kill lands before the end.
BSP = {"strategy": "bsp", "workers": 2, "servers": 1, "epochs": EPOCHS, "dataset": "digits",
       "steps_per_epoch": 10, "threads": 1, "worker_delay_s": [0.03, 0.03],
       "lr_decay_every": 1, "lr_decay": 0.5}
# Fields that time a run or say how often it checkpoints, and change none of its numbers:
# an uninterrupted run, the reference a resumed one must end at, leaves them out.
TIMING_ONLY = ("worker_delay_s", "checkpoint_every")


def _key(fields: dict) -> str:
    return json.dumps(fields, sort_keys=True)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """`get(fields, tmp_path)`: a run of these fields whose worker was SIGKILLed after
    epoch 2 (_kill_a_worker_after), copied into tmp_path/runs for the test to resume or
    damage as it likes; (that folder, the run's id). Each run is killed once for the module:
    tests that resume a run of the same fields resume copies of the same killed run."""
    made: dict[str, tuple[Path, str]] = {}

    def get(fields: dict, tmp_path: Path) -> tuple[Path, str]:
        key = _key(fields)
        if key not in made:
            out = tmp_path_factory.mktemp("killed") / "runs"
            made[key] = out, _kill_a_worker_after(out, fields, epochs_done=2)
        source, run_id = made[key]
        out = tmp_path / "runs"
        # Every process of the run has ended; SQLite rebuilds the store's shared-memory
        # index from the file and its log when the copy is first opened.
        shutil.copytree(source, out, ignore=shutil.ignore_patterns("*-shm"))
        return out, run_id
    return get


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """`get(fields)`: the summary of an uninterrupted run of these fields, less TIMING_ONLY's,
    trained once for the module."""
    made: dict[str, dict] = {}

    def get(fields: dict) -> dict:
        fields = {k: v for k, v in fields.items() if k not in TIMING_ONLY}
        key = _key(fields)
        if key not in made:
            made[key] = polyrhythm.train({**fields,
                                          "out": str(tmp_path_factory.mktemp("whole"))})
        return made[key]
    return get


def _store_of(summary: dict) -> RunStore:
    return RunStore(Path(summary["run_dir"]).parent / "polyrhythm.db")


def _started(out: Path, fields: dict, epochs_done: int) -> tuple[subprocess.Popen, Path,
                                                                  dict[int, psutil.Process]]:
    """Start `polyrhythm train` with these fields; (the launcher, its run's folder, its ranks)
    once every rank is up and a complete checkpoint of `epochs_done` epochs (or a later one)
    exists."""
    args = [sys.executable, "-m", "polyrhythm.cli", "train", "--out", str(out)]
    for key, value in fields.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):  # a switch: --flag or --no-flag
            args.append(flag if value else "--no-" + flag[2:])
            continue
        args += [flag, ",".join(map(str, value))] if isinstance(value, list) else [
            flag, str(value)]
    launcher = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    config = load_config(**fields)
    run_dir, _ = wait_for_checkpoint(out, launcher, config.workers, config.servers, epochs_done)
    return launcher, run_dir, wait_for_ranks(launcher, config.world_size)


def _kill_a_worker_after(out: Path, fields: dict, epochs_done: int) -> str:
    """Start `polyrhythm train` with these fields, SIGKILL a worker rank once a complete
    checkpoint of `epochs_done` epochs exists; the run's id (stored as failed)."""
    launcher, run_dir, ranks = _started(out, fields, epochs_done)
    os.kill(ranks[1].pid, signal.SIGKILL)
    _, stderr = finished(launcher, "after rank 1 was killed")
    assert launcher.returncode == 1 and "killed by SIGKILL" in stderr, stderr
    assert f"`polyrhythm train --resume {run_dir.name} --out {out}` goes on after" in stderr
    # Torn down, the failed run keeps its last two complete checkpoints and nothing else.
    kept = complete_epochs(run_dir, fields["workers"], fields.get("servers", 1))
    assert len(kept) == 2 and epochs_done in kept
    assert _checkpoint_folders(run_dir) == [f"epoch-{e:04d}" for e in kept]
    return run_dir.name


def _alive(process: psutil.Process) -> bool:
    """Running, not a zombie (an orphan ended but not yet reaped has let go of everything)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _checkpoint_folders(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "snapshots")


@pytest.mark.parametrize(("strategy", "extra"), [
    ("bsp", {}), ("allreduce", {}),
    ("bsp", {"optimizer": "adamw", "lr": 0.003}),  # the servers' AdamW state and step count
    ("switch", {"at": 0.25, "to": "bsp"}),  # resumed after the switch
    ("switch", {"at": 0.5, "to": "bsp"}),  # from the checkpoint of the switch's epoch
    # the workers' residuals and reply copies, the servers' copies of each worker
    ("bsp", {"compress": "topk", "ratio": 0.05, "compress_replies": True}),
    ("allreduce", {"compress": "powersgd", "rank": 2}),  # residuals and warm-start Qs
])
def test_a_killed_run_resumed_ends_where_an_uninterrupted_one_ends(tmp_path, killed,
                                                                  uninterrupted, strategy,
                                                                  extra):
    fields = {**BSP, "strategy": strategy, **extra}
    if strategy != "bsp":
        del fields["servers"]
    out, run_id = killed(fields, tmp_path)
    for later in complete_epochs(out / run_id, 2, 1):  # the kill may have come later
        if later > 2:
            shutil.rmtree(epoch_dir(out / run_id, later))
    said = []
    summary = polyrhythm.resume(run_id, out, say=said.append)
    assert summary["run_id"] == run_id and summary["status"] == "completed"
    assert said[-1].startswith(f"resuming run {run_id} after epoch 2 of {EPOCHS}")
    assert len(summary["epoch_metrics"]) == EPOCHS
    whole = uninterrupted(fields)
    assert max_diff(stored_parameters(summary), stored_parameters(whole)) <= 1e-5
    store = RunStore(out / "polyrhythm.db")
    (row,) = [r for r in store.runs() if r["run_id"] == run_id]
    assert row["status"] == "completed" and len(store.epochs(run_id)) == EPOCHS
    # The records made before the kill survive it, on one time line with those after.
    _assert_one_time_line(store, run_id, summary, _store_of(whole), whole["run_id"],
                          servers=strategy == "bsp")
    assert _checkpoint_folders(out / run_id) == [f"epoch-{EPOCHS - 1:04d}",
                                                 f"epoch-{EPOCHS:04d}"]


def _assert_one_time_line(store: RunStore, run_id: str, summary: dict, twin: RunStore,
                          twin_id: str, servers: bool) -> None:
    """Every step of every worker is in the resumed run's iterations, as many as the
    uninterrupted run's, each worker's in order on one clock that never goes back; so are
    the epochs' wall times and (with servers) the pushes; the run's training time covers
    every epoch's."""
    resumed = store.series("iterations", run_id)
    assert len(resumed) == len(twin.series("iterations", twin_id))
    for worker in (0, 1):
        rows = [r for r in resumed if r["worker"] == worker]
        assert [r["step"] for r in rows] == list(range(len(rows)))
        times = [r["t"] for r in rows]
        assert times == sorted(times) and len(set(times)) == len(times)
    walls = [e["wall_s"] for e in summary["epoch_metrics"]]
    assert walls == sorted(walls) and summary["wall_s"] >= walls[-1]
    if servers:
        pushes = store.series("pushes", run_id)
        assert len(pushes) == len(twin.series("pushes", twin_id))
        assert [p["t"] for p in pushes] == sorted(p["t"] for p in pushes)


def test_a_run_whose_launcher_was_killed_resumes_at_once_and_ends_as_an_uninterrupted_one(
        tmp_path, uninterrupted):
    """The launcher itself is SIGKILLed (an OOM kill, a closed terminal): its run is left
    `running` and its ranks leave on their own. `--resume` at once, with no listing in
    between to mark the run failed, waits for them and goes on."""
    fields = {**BSP, "checkpoint_every": 1}
    out = tmp_path / "runs"
    launcher, run_dir, _ = _started(out, fields, epochs_done=2)
    family = psutil.Process(launcher.pid).children(recursive=True)
    launcher.kill()
    launcher.communicate()
    assert RunStore(out / "polyrhythm.db").run(run_dir.name)["status"] == "running"
    said = []
    summary = polyrhythm.resume(run_dir.name, out, say=said.append)
    assert summary["status"] == "completed" and len(summary["epoch_metrics"]) == EPOCHS
    assert said[-1].startswith(f"resuming run {run_dir.name} after epoch ")
    assert not [p for p in family if _alive(p)]  # the resume waited for them to leave
    whole = uninterrupted(fields)
    assert max_diff(stored_parameters(summary), stored_parameters(whole)) <= 1e-5


def test_a_run_whose_launcher_lives_is_not_resumed_and_one_whose_launcher_is_gone_is(
        tmp_path):
    out = tmp_path / "runs"
    config = make_config({"strategy": "bsp", "workers": 2, "dataset": "digits",
                          "out": str(out)})
    live = start_run(config)  # launched by this process, which lives
    with pytest.raises(StoreError, match=f"run {live.run_id} is still running by process "
                                         f"{os.getpid()} on "):
        polyrhythm.resume(live.run_id, out)
    assert live.store.run(live.run_id)["status"] == "running"  # left as it was
    # Launched by a process that is gone (this pid, another start time): marked failed as a
    # listing would, then resumed; this one wrote no checkpoint, so that is what it says.
    gone = RunRecord(out, "20260101-000000-bsp-gone00")
    (gone.dir / "logs").mkdir(parents=True)
    (gone.dir / "config.toml").write_text(config.to_toml())
    gone.store.add_run(gone.run_id, "2026-01-01T00:00:00+00:00", config.columns(),
                       config.to_toml(), launcher={**process_identity(), "start": "0"})
    with pytest.raises(DataError, match="no usable checkpoint"):
        polyrhythm.resume(gone.run_id, out)
    row = gone.store.run(gone.run_id)
    assert row["status"] == "failed" and row["error"] == LAUNCHER_GONE
    live.store.complete_run(live.run_id, {"final_val_accuracy": 0.5, "samples_per_s": 1.0,
                                          "wall_s": 1.0}, [])
    with pytest.raises(StoreError, match=f"run {live.run_id} is completed: only a failed"):
        polyrhythm.resume(live.run_id, out)


def test_resume_waits_for_the_processes_that_still_hold_the_run(tmp_path):
    """A rank of the run (here a stand-in that takes the ranks' hold) keeps a resume
    waiting; once it is gone the wait ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from polyrhythm.launch.process import runlock; "
         f"runlock.hold({str(tmp_path)!r}); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(StoreError, match="still run after 0.2 s"):
            runlock.wait_until_free(tmp_path, timeout=0.2)
    finally:
        holder.kill()
        holder.wait()
    runlock.wait_until_free(tmp_path, timeout=60)  # returns once the hold is let go


@pytest.mark.parametrize("optimizer", [
    {},  # the momentum buffer, re-sliced
    {"optimizer": "adam", "lr": 0.003},  # both moments re-sliced, the step count carried
])
def test_resuming_with_two_servers_instead_of_one_matches(tmp_path, killed, uninterrupted,
                                                         optimizer):
    fields = {**BSP, **optimizer}
    out, run_id = killed(fields, tmp_path)
    summary = polyrhythm.resume(run_id, out, say=lambda line: None, servers=2)
    assert summary["servers"] == 2
    whole = uninterrupted(fields)
    assert max_diff(stored_parameters(summary), stored_parameters(whole)) <= 1e-5


def test_a_checkpoint_with_flipped_bytes_is_passed_over_said_and_set_aside(tmp_path, killed):
    """The newest server file's bytes flipped: it still loads (other numbers), so only its
    digest tells; the resume goes on from the checkpoint before it, and the damaged one is
    set aside, so the epochs redone write a checkpoint of their own."""
    out, run_id = killed(BSP, tmp_path)
    newest = complete_epochs(out / run_id, 2, 1)[-1]
    flip_tensor_bytes(epoch_dir(out / run_id, newest) / "server-0.pt")
    said = []
    summary = polyrhythm.resume(run_id, out, say=said.append)
    assert said[0].startswith(f"checkpoint after epoch {newest} is damaged (server-0.pt does "
                              "not match its digest): set aside in ")
    assert said[-1].startswith(f"resuming run {run_id} after epoch {newest - 1}")
    assert summary["status"] == "completed"
    assert [p.name for p in (out / run_id / "checkpoints" / "set-aside").iterdir()] == [
        f"epoch-{newest:04d}-damaged"]
    model = torch.load(out / run_id / "checkpoints" / f"epoch-{EPOCHS:04d}" / "model.pt",
                       weights_only=True)
    assert set(model) == {"model", "optimizer"}  # plain PyTorch state_dicts


def test_a_diverging_run_stops_with_one_line_naming_epoch_and_step(tmp_path, capfd):
    code = main(["train", "--dataset", "digits", "--lr", "1e6", "--workers", "2", "--epochs",
                 "2", "--out", str(tmp_path)])
    stderr = capfd.readouterr().err
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert "diverged at epoch 1, step" in stderr and "training loss nan" in stderr
    (row,) = RunStore(tmp_path / "polyrhythm.db").runs()
    assert row["status"] == "diverged" and row["error"].startswith("diverged at epoch 1")


def test_a_frozen_peer_becomes_a_timeout_error_naming_it_and_every_process_ends(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", "asp", "--workers", "2",
         "--dataset", "digits", "--epochs", "50", "--timeout", "4", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(tmp_path, launcher, workers=2, servers=1)  # training, not starting up
    ranks = wait_for_ranks(launcher, 3)
    family = psutil.Process(launcher.pid).children(recursive=True)
    os.kill(ranks[0].pid, signal.SIGSTOP)  # the server: every worker waits on it
    try:
        _, stderr = finished(launcher, "after the server froze")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            ranks[0].kill()  # a stopped process lingers if the run did not end it
    # It ended because the server froze (49 epochs were left), saying so in one line.
    assert launcher.returncode == 1 and stderr.count("\n") == 1, stderr
    assert "rank 0 (server 0) stopped answering" in stderr
    (row,) = RunStore(tmp_path / "polyrhythm.db").runs()
    assert row["status"] == "failed" and "rank 0 (server 0) stopped answering" in row["error"]
    gone, alive = psutil.wait_procs(family, timeout=HANG_GUARD_S)
    assert not alive, alive


def test_an_asp_run_resumed_carries_on_from_its_checkpoint(tmp_path):
    # asp's updates interleave as timing has it, so its final model differs from run to run
    # (uninterrupted runs of one seed by 1 % at times): what a resume must get right is
    # what it restores, which is exact, and that training goes on from there.
    # abort: by default an asp run goes on without a lost worker, and nothing is resumed.
    fields = {"strategy": "asp", "workers": 2, "servers": 1, "epochs": EPOCHS,
              "dataset": "mnist5k", "lr_decay_every": 3, "lr_decay": 0.1,
              "on_worker_failure": "abort"}
    out = tmp_path / "runs"
    run_id = _kill_a_worker_after(out, fields, epochs_done=2)
    done = complete_epochs(out / run_id, 2, 1)[-1]  # the newest: the one resumed from
    folder = epoch_dir(out / run_id, done)
    kept = [torch.load(folder / f"worker-{w}.pt", weights_only=True)["epochs"] for w in (0, 1)]
    (server,) = torch.load(folder / "server-0.pt", weights_only=True)["buckets"].values()
    said = []
    summary = polyrhythm.resume(run_id, out, say=said.append)
    assert said[-1].startswith(f"resuming run {run_id} after epoch {done} of {EPOCHS}")
    assert summary["status"] == "completed" and len(summary["epoch_metrics"]) == EPOCHS
    steps = kept[0][0]["samples"] // (64 // 2)  # an epoch's steps: its samples / batch
    # The server's version carried on: a global batch's worth is 2 pushes, each an update,
    # and the checkpoint holds exactly `done` epochs' worth; then every worker takes its
    # remaining steps from its own checkpointed position. Updates counted from 0 again, or
    # steps redone or skipped, would miss this count.
    assert server["version"] == 2 * steps * done and server["progress"] == steps * done
    assert [w["steps"] for w in summary["per_worker"]] == [steps * EPOCHS] * 2
    assert summary["weight_updates"] == 2 * steps * EPOCHS
    # The epochs done before the kill are the checkpoint's records, as they were.
    epochs = summary["epoch_metrics"]
    for e in range(done):
        assert epochs[e]["train_loss"] == (kept[0][e]["train_loss"]
                                           + kept[1][e]["train_loss"]) / 2, e
    # Training went on from the checkpoint's model, not from a fresh one: the first epoch
    # after it is far closer to where the run had got (epoch `done`) than to where it began
    # (a model started anew would be back at about epoch 1's loss).
    assert all(math.isfinite(e["train_loss"]) and math.isfinite(e["val_loss"]) for e in epochs)
    began, got = epochs[0]["train_loss"], epochs[done - 1]["train_loss"]
    assert epochs[done]["train_loss"] < (began + got) / 2, [e["train_loss"] for e in epochs]
    assert summary["final_val_accuracy"] > 0.9
