"""The store is the truth: nobody is told a run completed before the store holds it.

A run whose store is locked past its wait at the end, or whose disk fills, exits non-zero
with one line; `runs` shows why; what trained is kept for `runs --repair`; no `.partial`
file is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import HANG_GUARD_S, finished
from polyrhythm.errors import StoreError
from polyrhythm.metrics.records import RunRecord, complete_run, fail_run
from polyrhythm.metrics.store import RunStore

# The file names and reason of metrics/runfolder.py, as a user sees them.
UNRECORDED_FILE = "unrecorded.json"
UNRECORDED = ("trained to its end, but the store could not record it: `polyrhythm runs "
              "--repair` records its kept results")

TRAIN = ["train", "--dataset", "digits", "--strategy", "allreduce", "--workers", "1",
         "--epochs", "2", "--steps-per-epoch", "3", "--json"]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polyrhythm.cli", *args], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=env)


def launch(out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "polyrhythm.cli", *TRAIN, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_row(out: Path, launcher: subprocess.Popen) -> str:
    """The id of the run the launcher stored as running (it has not begun to train: its
    launcher writes nothing more to the store until the run ends)."""
    store = RunStore(out / "polyrhythm.db")
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and launcher.poll() is None:
        if store.path.exists() and (rows := store.runs()):
            return rows[0]["run_id"]
        time.sleep(0.02)
    pytest.fail(f"no run row appeared; the launcher said: {launcher.communicate()[1]}")


def partial_files(out: Path) -> list[Path]:
    return sorted(out.rglob("*.partial"))


def stored(out: Path, run_id: str) -> dict:
    return RunStore(out / "polyrhythm.db").run(run_id)


def test_a_store_locked_at_the_run_end_is_a_failure_that_runs_shows_and_repair_records(
        tmp_path):
    out = tmp_path / "runs"
    env = {**os.environ, "POLYRHYTHM_STORE_WAIT_S": "0.5"}
    launcher = launch(out, env)
    run_id = wait_for_row(out, launcher)
    # Another process holds the store's write lock from before the run trains to after its
    # launcher has ended.
    holder = sqlite3.connect(out / "polyrhythm.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        stdout, stderr = finished(launcher, "with the store locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert launcher.returncode != 0
    assert stdout == ""  # no summary told
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "could not record" in lines[0], stderr
    assert "runs --repair" in lines[0]
    listed = [json.loads(line) for line in cli("runs", "--out", str(out), "--json")
              .stdout.splitlines()]
    assert [(r["run_id"], r["status"], r["error"]) for r in listed] == [
        (run_id, "failed", UNRECORDED)]
    assert "failed (unrecorded: --repair)" in cli("runs", "--out", str(out)).stdout
    assert (out / run_id / UNRECORDED_FILE).is_file()
    assert partial_files(out) == []

    repaired = cli("runs", "--repair", "--out", str(out))
    assert repaired.returncode == 0, repaired.stderr
    assert f"recorded run {run_id}" in repaired.stderr
    row = stored(out, run_id)
    assert row["status"] == "completed"
    summary = json.loads(row["summary"])
    assert summary["epochs"] == 2
    assert len(RunStore(out / "polyrhythm.db").epochs(run_id)) == 2
    assert json.loads((out / run_id / "summary.json").read_text()) == summary
    assert not (out / run_id / UNRECORDED_FILE).exists()
    again = cli("runs", "--repair", "--out", str(out))
    assert "no kept results to record" in again.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs: a disk that can fill (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("filling a disk needs root to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> None:
    """Write a file until the disk has no space left, to the last bytes."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def test_a_disk_that_fills_during_a_run_fails_it_with_the_reason_in_runs(small_disk):
    out = small_disk / "runs"
    launcher = launch(out, dict(os.environ))
    run_id = wait_for_row(out, launcher)
    fill(small_disk)
    stdout, stderr = finished(launcher, "with its disk full")
    assert launcher.returncode != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "is full" in lines[0], stderr
    assert stdout == ""
    row = stored(out, run_id)
    assert row["status"] == "failed" and "is full" in row["error"]
    assert json.loads((out / run_id / "summary.json").read_text())["error"] == row["error"]
    assert partial_files(out) == []


def test_the_store_is_told_before_the_summary_and_a_refusal_keeps_the_results(tmp_path,
                                                                               monkeypatch):
    """complete_run: a store that refuses leaves no completed summary.json, only the kept
    results; fail_run's reason stays in the folder when the store cannot take it."""
    from polyrhythm.metrics.records import repair_runs
    out = tmp_path / "runs"
    store = RunStore(out / "polyrhythm.db")
    record = RunRecord(out, "20261203-000000-bsp-abcdef")
    (record.dir / "logs").mkdir(parents=True)
    store.add_run(record.run_id, "2026-12-03T00:00:00",
                  {"strategy": "bsp", "workers": 1, "servers": 1, "epochs": 1,
                   "dataset": "digits", "model": "mlp"}, "")

    def locked(*args, **kwargs):
        raise StoreError("run store 'x': database is locked")

    monkeypatch.setattr(RunStore, "complete_run", locked)
    monkeypatch.setattr(RunStore, "fail_run", locked)
    summary = {"final_val_accuracy": 0.5, "samples_per_s": 1.0, "wall_s": 1.0, "epochs": 1}
    epoch = {"epoch": 1, "train_loss": 1.0}
    with pytest.raises(StoreError, match="could not record it .*runs --repair"):
        complete_run(record, summary, [epoch], {"updates": [(0, 0.1, 0.01)]})
    assert not (record.dir / "summary.json").exists()
    with pytest.raises(StoreError, match="^rank 0 failed: boom; the store could not"):
        fail_run(record, "rank 0 failed: boom")
    assert json.loads((record.dir / "summary.json").read_text())["error"] == \
        "rank 0 failed: boom"
    monkeypatch.undo()
    assert store.runs()[0]["status"] == "running"  # its launcher (this process) lives
    assert repair_runs(out) == []  # a running run is left alone
    store.fail_run(record.run_id, "failed: the launcher stopped")
    assert repair_runs(out) == [record.run_id]
    assert store.run(record.run_id)["status"] == "completed"
    assert store.series("updates", record.run_id) == [{"server": 0, "t": 0.1, "seconds": 0.01}]


def test_an_atomic_file_that_fails_leaves_neither_a_partial_nor_a_half_file(tmp_path):
    from polyrhythm.files import atomic_file
    path = tmp_path / "model.pt"
    path.write_bytes(b"previous")
    with pytest.raises(OSError), atomic_file(path) as file:
        file.write(b"half")
        raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"previous"
    assert list(tmp_path.iterdir()) == [path]


def test_an_id_read_from_a_store_never_names_a_folder_elsewhere(tmp_path):
    from polyrhythm.metrics.runfolder import kept_reason
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "summary.json").write_text('{"status": "failed", "error": "x"}')
    store_dir = tmp_path / "runs"
    store_dir.mkdir()
    assert kept_reason(store_dir, "../outside") is None
    assert kept_reason(tmp_path, "outside") == "x"


@pytest.mark.parametrize("shared", [False, True])
def test_a_runs_files_are_its_owners_alone_unless_shared(tmp_path, shared):
    """A new run's folder (everything it writes lies inside) is 0700 and a new store 0600;
    with shared_perms both follow the umask (022 here: readable by others)."""
    from polyrhythm.config import RunConfig
    from polyrhythm.metrics.records import start_run
    old = os.umask(0o022)
    try:
        record = start_run(RunConfig(out=str(tmp_path / "runs"), shared_perms=shared))
    finally:
        os.umask(old)
    modes = {path: path.stat().st_mode & 0o777
             for path in (record.out, record.dir, record.dir / "logs",
                          record.out / "polyrhythm.db")}
    if shared:
        assert set(modes.values()) == {0o755, 0o644}
        assert modes[record.out / "polyrhythm.db"] == 0o644
    else:
        assert modes == {record.out: 0o700, record.dir: 0o700, record.dir / "logs": 0o700,
                         record.out / "polyrhythm.db": 0o600}
    # The store's journal files take its mode (SQLite's own rule), once written.
    RunStore(record.out / "polyrhythm.db").runs()
    for journal in record.out.glob("polyrhythm.db-*"):
        assert journal.stat().st_mode & 0o777 == modes[record.out / "polyrhythm.db"]


def test_a_checkpoint_file_that_cannot_be_written_leaves_no_partial_file(tmp_path,
                                                                         monkeypatch):
    """A full disk while a checkpoint is written (torch.save raising ENOSPC half-way)."""
    import torch

    from polyrhythm.runtime import checkpoint

    def half_then_full(state, file):
        file.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_full)
    path = tmp_path / "checkpoints" / "epoch-0001" / "worker-0.pt"
    with pytest.raises(OSError, match="No space"):
        checkpoint.save({"w": 1}, path)
    assert list(path.parent.iterdir()) == []


def test_a_named_pipe_in_a_checkpoint_files_place_is_refused_not_waited_on(tmp_path):
    """A resume's check of digests opens each file without waiting for a writer."""
    import hashlib
    import threading

    from polyrhythm.runtime import digests

    path = tmp_path / "worker-0.pt"
    os.mkfifo(path)
    digests.of(path).write_text(f"{hashlib.sha256(b'x').hexdigest()}  worker-0.pt\n")
    found: list = []
    checking = threading.Thread(target=lambda: found.append(digests.problem(path)),
                                daemon=True)
    checking.start()
    checking.join(timeout=60)
    assert not checking.is_alive(), "the check waited on the pipe"
    assert "not a regular file" in found[0]
    os.mkfifo(tmp_path / "server-0.pt.sha256")
    (tmp_path / "server-0.pt").write_bytes(b"x")
    assert "digest cannot be read" in digests.problem(tmp_path / "server-0.pt")
