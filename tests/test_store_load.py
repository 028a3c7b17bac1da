"""The run store under load and faults: several processes training, listing and reporting on
one store at once lose nothing; a run whose launcher died (SIGKILL) reads `failed (launcher
gone)` the next time the runs are listed, and a run whose launcher lives is never marked; a
schema-3 store opens and gains the launcher column."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil

from polyrhythm.config import make_config
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import (
    LAUNCHER_GONE,
    SCHEMA_VERSION,
    RunStore,
    launcher_gone,
    process_identity,
)

QUICK = ("--dataset", "digits", "--workers", "1", "--epochs", "2", "--steps-per-epoch", "3")
# Long enough to be caught running: 100 epochs of 10 steps of at least 50 ms.
LONG = ("--dataset", "digits", "--workers", "1", "--epochs", "100", "--steps-per-epoch", "10",
        "--worker-delay-s", "0.05")
LOCKED = "database is locked"


def polyrhythm(*args: str) -> list[str]:
    return [sys.executable, "-m", "polyrhythm.cli", *args]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(polyrhythm(*args), capture_output=True, text=True, timeout=300)


def listed(out: Path) -> dict[str, dict]:
    """`polyrhythm runs --json`, by run id."""
    done = cli("runs", "--out", str(out), "--json")
    assert done.returncode == 0 and LOCKED not in done.stderr, done.stderr
    return {r["run_id"]: r for r in map(json.loads, done.stdout.splitlines())}


def seed_run(out: Path) -> str:
    """A completed run (two epochs) for the reports to read while others train."""
    store = RunStore(out / STORE_NAME)
    config = make_config({"workers": 1, "dataset": "digits", "out": str(out)})
    run_id = "20260101-000000-bsp-000000"
    store.add_run(run_id, "2026-01-01T00:00:00+00:00", config.columns(), config.to_toml())
    epochs = [{"epoch": e, "train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5,
               "samples_per_s": 100.0, "wall_s": e + 1.0} for e in range(2)]
    store.complete_run(run_id, {"final_val_accuracy": 0.5, "samples_per_s": 100.0,
                                "wall_s": 2.0}, epochs)
    return run_id


def test_four_trains_and_reports_on_one_store_lose_nothing(tmp_path):
    out = tmp_path / "runs"
    # A new store: the trains (and this process) make it at once.
    trains = [subprocess.Popen(polyrhythm("train", *QUICK, "--out", str(out), "--json"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    seeded = seed_run(out)
    readers = 0
    while any(t.poll() is None for t in trains):  # list and report while they train
        listed(out)
        report = cli("report", "--out", str(out), "--format", "md", seeded)
        assert report.returncode == 0 and LOCKED not in report.stderr, report.stderr
        readers += 2
    ids = []
    for train in trains:
        stdout, stderr = train.communicate(timeout=300)
        assert train.returncode == 0 and LOCKED not in stderr, stderr
        ids.append(json.loads(stdout.splitlines()[-1])["run_id"])
    assert readers >= 2 and len(set(ids)) == 4
    runs = listed(out)
    assert set(runs) == {seeded, *ids}
    store = RunStore(out / STORE_NAME)
    for run_id in ids:
        assert runs[run_id]["status"] == "completed" and runs[run_id]["epochs"] == 2
        assert [e["epoch"] for e in store.epochs(run_id)] == [0, 1]
        assert store.series("iterations", run_id)  # every event series arrived too
        for log in (out / run_id / "logs").iterdir():
            assert LOCKED not in log.read_text()
    table = cli("runs", "--out", str(out)).stdout
    assert all(f"{run_id} completed" in " ".join(table.split()) for run_id in ids)
    report = cli("report", "--out", str(out), "--format", "md", *ids)
    assert report.returncode == 0, report.stderr
    text = Path(report.stdout.strip()).read_text()
    assert all(run_id in text for run_id in ids)


def running_launcher(out: Path) -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    """Start a long `polyrhythm train`; once its ranks run and its row reads running, the
    launcher, its run id and every process it started (the forkserver and the ranks)."""
    before = set(_rows(out))
    launcher = subprocess.Popen(polyrhythm("train", *LONG, "--out", str(out)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(launcher.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        assert launcher.poll() is None, launcher.communicate()
        ranks = [p for p in parent.children(recursive=True) if _name(p).startswith("polyrhythm-r")]
        new = {i: status for i, status in _rows(out).items() if i not in before}
        if len(ranks) == 2 and list(new.values()) == ["running"]:
            return launcher, next(iter(new)), parent.children(recursive=True)
    launcher.kill()  # its ranks see their launcher gone and leave
    raise AssertionError(f"the run did not start: {launcher.communicate()}")


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


def _rows(out: Path) -> dict[str, str]:
    """run id -> status, read straight from the file (not RunStore.runs, which would mark)."""
    try:
        with sqlite3.connect(out / STORE_NAME, timeout=30) as conn:
            return dict(conn.execute("SELECT run_id, status FROM runs"))
    except sqlite3.OperationalError:  # not created yet
        return {}


def test_a_killed_launchers_run_reads_failed_and_a_live_one_is_left_running(tmp_path):
    out = tmp_path / "runs"
    victim, killed, family = running_launcher(out)
    live, running, _ = running_launcher(out)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=30)  # its ranks leave with it
    assert not alive, alive
    try:
        runs = listed(out)
        assert runs[killed]["status"] == "failed" and runs[killed]["error"] == LAUNCHER_GONE
        assert runs[running]["status"] == "running" and runs[running]["error"] is None
        table = cli("runs", "--out", str(out))
        assert table.returncode == 0, table.stderr
        lines = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
        assert "failed (launcher gone)" in lines[killed]
        assert " running " in lines[running]
        # Opened again (and by this process), the live run stays running.
        assert RunStore(out / STORE_NAME).run(running)["status"] == "running"
        assert {r["run_id"]: r["status"] for r in RunStore(out / STORE_NAME).runs()}[
            running] == "running"
    finally:
        live.send_signal(signal.SIGTERM)  # stops the run cleanly: stored as interrupted
        live.communicate(timeout=60)
    after = RunStore(out / STORE_NAME).run(running)
    assert after["status"] == "failed" and after["error"] != LAUNCHER_GONE


def test_only_a_launcher_surely_gone_is_gone():
    here = process_identity()
    assert not launcher_gone(here, here)  # this process
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        identity = process_identity(child.pid)
        assert identity["pid"] == child.pid and identity["start"] is not None
        assert not launcher_gone(identity, here)
        # The pid reused by another process: it started at another time.
        assert launcher_gone({**identity, "start": str(int(identity["start"]) - 1)}, here)
        child.kill()
        zombie = psutil.Process(child.pid)  # not waited for, so it stays as a zombie
        deadline = time.monotonic() + 60  # a hang guard: the kill takes a moment
        while zombie.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "SIGKILL did not end the child"
            time.sleep(0.01)
        assert launcher_gone(identity, here)  # a zombie, not yet waited for
    finally:
        child.kill()
        child.wait()
    assert launcher_gone(identity, here)
    # Another host's or container's pids are not ours to judge; nor a row without launcher.
    assert not launcher_gone({**identity, "host": "elsewhere"}, here)
    assert not launcher_gone({**identity, "pidns": "pid:[1]"}, here)
    assert not launcher_gone(None, here)
    assert launcher_gone({**here, "boot": "another-boot"}, here)  # rebooted since


def test_a_reason_given_later_replaces_launcher_gone(tmp_path):
    """An emulated run's janitor outlives its launcher and says what happened; a listing
    may have guessed `launcher gone` before it did."""
    store = RunStore(tmp_path / STORE_NAME)
    config = make_config({"workers": 1, "dataset": "digits", "out": str(tmp_path)})
    gone = {**process_identity(), "start": "0"}  # this pid, another process: gone
    store.add_run("r", "2026-01-01T00:00:00+00:00", config.columns(), config.to_toml(), gone)
    assert store.fail_orphans() == ["r"] and store.fail_orphans() == []
    assert store.run("r")["error"] == LAUNCHER_GONE
    assert store.fail_run("r", "failed: the launcher was killed; all processes stopped")
    assert store.run("r")["error"] == "failed: the launcher was killed; all processes stopped"
    assert not store.fail_run("r", "something else")  # only launcher gone is replaced


def test_many_writers_and_readers_on_a_new_store_lose_nothing(tmp_path):
    """Eight processes create the store at once and write runs, epochs and series while two
    list it: no error, nothing lost (the schema is made once, under the write lock)."""
    path = tmp_path / STORE_NAME
    writer = f"""
import sys
from polyrhythm.metrics.store import RunStore
store, p = RunStore({str(path)!r}), int(sys.argv[1])
columns = dict(strategy="bsp", workers=2, servers=1, epochs=2, dataset="digits", model="mlp")
for k in range(5):
    run_id = f"p{{p}}-r{{k}}"
    store.add_run(run_id, f"2026-01-01T00:00:{{k:02d}}", columns, "x = 1")
    epochs = [dict(epoch=e, train_loss=1.0, val_loss=1.0, val_accuracy=0.5) for e in range(2)]
    rows = [(w, s, 0, s * 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.5) for w in range(2)
            for s in range(200)]
    store.complete_run(run_id, dict(final_val_accuracy=0.5, samples_per_s=1.0, wall_s=1.0),
                       epochs, dict(iterations=rows))
"""
    reader = f"""
import time
from polyrhythm.metrics.store import RunStore
store = RunStore({str(path)!r})
end = time.monotonic() + 3
while time.monotonic() < end:
    for run in store.runs():
        store.epochs(run["run_id"])
"""
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(p)], stderr=subprocess.PIPE,
                              text=True) for p in range(8)]
    procs += [subprocess.Popen([sys.executable, "-c", reader], stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    store = RunStore(path)
    runs = store.runs()
    assert len(runs) == 40 and all(r["status"] == "completed" for r in runs)
    assert all(len(store.epochs(r["run_id"])) == 2 for r in runs)
    assert all(len(store.series("iterations", r["run_id"])) == 400 for r in runs)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


SCHEMA_3 = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, created TEXT NOT NULL, status TEXT NOT NULL,
    strategy TEXT NOT NULL, workers INTEGER NOT NULL, servers INTEGER NOT NULL,
    epochs INTEGER NOT NULL, dataset TEXT NOT NULL, model TEXT NOT NULL, config TEXT NOT NULL,
    summary TEXT, error TEXT, final_val_accuracy REAL, samples_per_s REAL, wall_s REAL);
CREATE TABLE epochs (run_id TEXT NOT NULL, epoch INTEGER NOT NULL, train_loss REAL,
    val_loss REAL, val_accuracy REAL, samples_per_s REAL, wall_s REAL, phase TEXT,
    rule_score REAL, rule_fired INTEGER, rule_why TEXT, PRIMARY KEY (run_id, epoch));
CREATE TABLE iterations (run_id TEXT NOT NULL, worker INTEGER NOT NULL, step INTEGER NOT NULL,
    epoch INTEGER NOT NULL, t REAL NOT NULL, compute_s REAL NOT NULL, push_s REAL NOT NULL,
    wait_s REAL NOT NULL, pull_s REAL NOT NULL, apply_s REAL NOT NULL, total_s REAL NOT NULL,
    PRIMARY KEY (run_id, worker, step));
CREATE TABLE pushes (run_id TEXT NOT NULL, server INTEGER NOT NULL, t REAL NOT NULL,
    worker INTEGER NOT NULL, staleness INTEGER NOT NULL, queue INTEGER NOT NULL);
CREATE TABLE updates (run_id TEXT NOT NULL, server INTEGER NOT NULL, t REAL NOT NULL,
    seconds REAL NOT NULL);
CREATE TABLE resources (run_id TEXT NOT NULL, rank INTEGER NOT NULL, role TEXT NOT NULL,
    t REAL NOT NULL, cpu_percent REAL NOT NULL, rss_bytes INTEGER NOT NULL,
    bytes_sent INTEGER NOT NULL, bytes_received INTEGER NOT NULL);
INSERT INTO runs VALUES ('old-done', '2026-01-01T00:00:00+00:00', 'completed', 'bsp', 2, 1, 2,
    'digits', 'mlp', 'strategy = "bsp"', '{}', NULL, 0.9, 800.0, 3.0);
INSERT INTO runs VALUES ('old-running', '2026-01-01T00:00:01+00:00', 'running', 'bsp', 2, 1, 2,
    'digits', 'mlp', 'strategy = "bsp"', NULL, NULL, NULL, NULL, NULL);
INSERT INTO epochs VALUES ('old-done', 0, 0.5, 0.4, 0.9, 800.0, 1.0, NULL, NULL, NULL, NULL);
PRAGMA user_version = 3;
"""


def test_a_schema_3_store_opens_and_gains_the_launcher_column(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    path = out / STORE_NAME
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_3)
    conn.close()
    # Several processes opening it at once migrate it once.
    opener = ("import sys; from polyrhythm.metrics.store import RunStore; "
              "RunStore(sys.argv[1]).epochs('old-done')")
    procs = [subprocess.Popen([sys.executable, "-c", opener, str(path)], stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        columns = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    conn.close()
    assert columns[-1] == "launcher"
    runs = listed(out)
    assert runs["old-done"]["status"] == "completed" and runs["old-done"]["launcher"] is None
    # Nobody knows who ran the old running row: it is left as it is.
    assert runs["old-running"]["status"] == "running"
    (epoch,) = RunStore(path).epochs("old-done")
    assert epoch["val_accuracy"] == 0.9
    # A new run in the migrated store names its launcher.
    config = make_config({"workers": 1, "dataset": "digits", "out": str(out)})
    RunStore(path).add_run("new", "2026-01-02T00:00:00+00:00", config.columns(),
                           config.to_toml())
    assert listed(out)["new"]["launcher"] == process_identity()
