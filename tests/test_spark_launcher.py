"""`--launcher spark`: every rank a Spark barrier task on a real Spark (local-cluster: a driver
JVM and an executor JVM per rank, each with its Python workers), each running
polyrhythm.node. A bsp run takes the local launcher's steps and is stored like any other; a
killed rank fails the run naming it, and nothing Spark or the run started is left; what Spark
cannot run is one line before any run record; rank 0's store listens on the job's address
only and refuses a stranger while the run goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

import polyrhythm
from helpers import (
    HANG_GUARD_S,
    SPARK_CONF,
    equivalence_config,
    finished,
    give_up,
    max_diff,
    stored_parameters,
)
from polyrhythm.cli import main
from polyrhythm.config.spark import check_placeable, master_of, task_slots
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError
from polyrhythm.launch.launchers.spark import RUN_VARIABLE, processes_of
from polyrhythm.launch.launchers.spark_ranks import explained, ranks_failure, task_failure
from polyrhythm.launch.launchers.spark_task import host_of
from polyrhythm.launch.process.failures import TRAINING_MARK, Kind, RankFailure
from polyrhythm.metrics.records import STORE_NAME, RunRecord
from polyrhythm.metrics.store import RunStore


def java_processes() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "java"}


def stray_jvms(before: set[int], run_id: str) -> list[psutil.Process]:
    """JVMs started since `before` that are still there, but another Spark run's (another
    run's variable: a run started beside the test's, which its own launcher ends)."""
    stray = []
    for pid in java_processes() - before:
        try:
            process = psutil.Process(pid)
            if process.environ().get(RUN_VARIABLE, run_id) == run_id:
                stray.append(process)
        except psutil.Error:
            continue  # gone while looked at
    return stray


def test_a_bsp_run_on_spark_takes_the_local_launchers_steps(tmp_path, monkeypatch):
    """Relative `out`: the executors run in Spark's own folders, yet rank 0 completes the
    record in this folder's store."""
    monkeypatch.chdir(tmp_path)
    config = equivalence_config(tmp_path, strategy="bsp", workers=2, servers=1, out="runs")
    before = java_processes()
    spark = polyrhythm.train(config, launcher="spark", spark_conf=SPARK_CONF)
    local = polyrhythm.train(config)
    assert max_diff(stored_parameters(spark), stored_parameters(local)) <= 1e-4
    assert spark.keys() == local.keys()
    assert spark["status"] == "completed" and spark["weight_updates"] == 20
    row = RunStore(tmp_path / "runs" / STORE_NAME).run(spark["run_id"])
    assert row["status"] == "completed" and row["strategy"] == "bsp"
    logs = tmp_path / "runs" / spark["run_id"] / "logs"
    assert "[worker 1] epoch 2/2" in (logs / "rank2.log").read_text()
    assert processes_of(spark["run_id"]) == []
    assert stray_jvms(before, spark["run_id"]) == []


def rank_of_run(out: Path, rank: int, launcher: subprocess.Popen,
                timeout: float = HANG_GUARD_S) -> psutil.Process:
    """The polyrhythm.node process of rank `rank` of the run launched into `out`, once it
    runs."""
    deadline = time.monotonic() + timeout
    while launcher.poll() is None and time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            command = " ".join(process.info["cmdline"] or [])
            if "polyrhythm.node" not in command or str(out) not in command:
                continue
            try:
                environment = process.environ()
            except psutil.Error:
                continue
            if environment.get("RANK") == str(rank) and RUN_VARIABLE in environment:
                return process
        time.sleep(0.05)
    give_up(launcher, f"rank {rank}'s process", timeout)


def training(run_dir: Path, launcher: subprocess.Popen, timeout: float = HANG_GUARD_S) -> None:
    """Wait until a worker of the run has taken a step (its mark in the run's logs)."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "logs" / TRAINING_MARK).exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            give_up(launcher, "the run's first step", timeout)
        time.sleep(0.05)


def test_a_killed_rank_fails_the_run_naming_it_and_leaves_nothing(tmp_path):
    out = tmp_path / "runs"
    before = java_processes()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "polyrhythm.cli", "train", "--launcher", "spark", "--strategy",
         "bsp", "--workers", "2", "--dataset", "digits", "--epochs", "1000", "--out", str(out),
         "--spark-conf", *SPARK_CONF],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank = rank_of_run(out, 2, launcher)
    run_id = rank.environ()[RUN_VARIABLE]
    training(out / run_id, launcher)
    rank.send_signal(signal.SIGKILL)
    _, err = finished(launcher, "after rank 2 was killed")
    assert launcher.returncode == 1, err
    said = "rank 2 (worker 1) was killed by SIGKILL"
    assert said in err and err.count("\n") == 1 and "Traceback" not in err, err
    run = RunStore(out / STORE_NAME).run(run_id)
    assert run["status"] == "failed" and said in run["error"]
    # No JVM, PySpark daemon or worker, no rank: the launcher waited until all were gone.
    assert processes_of(run_id) == []
    assert stray_jvms(before, run_id) == []


def test_what_spark_cannot_run_is_one_line_before_any_record(tmp_path, capsys):
    """The command line in this process (as test_mapreduce.py's twin): each refusal comes
    before any process, JVM or record is made."""
    out = tmp_path / "runs"
    base = ["train", "--launcher", "spark", "--dataset", "digits", "--out", str(out)]
    cases = {
        ("--master", "spark://127.0.0.1:1"): "Spark master spark://127.0.0.1:1 is "
                                             "unreachable",
        ("--executor-memory", "300"): "executor_memory must be at least 450",
        ("--workers", "2", "--strategy", "bsp", "--master", "local-cluster[2,1,1024]"):
            "runs 2 tasks at once but --launcher spark needs 3 at once for 3 ranks",
        ("--on-worker-failure", "continue", "--strategy", "asp"):
            "--launcher spark cannot go on without a lost worker",
    }
    for flags, said in cases.items():
        code = main([*base, *flags])
        err = capsys.readouterr().err
        assert code == 2, err
        assert said in err and err.count("\n") == 1, err
    assert not out.exists() or not list(out.glob("2*"))


def test_without_java_the_run_names_the_jdk_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ConfigError, match="install a Java runtime .*openjdk-17") as raised:
        polyrhythm.train(equivalence_config(tmp_path, dataset="digits"), launcher="spark")
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("2*"))


def test_placement_checks_without_spark(tmp_path):
    config = equivalence_config(tmp_path, strategy="bsp", workers=2, launcher="spark")
    assert master_of(config) == "local-cluster[3,1,1024]"  # a rank per executor
    check_placeable(config, 2)
    assert task_slots("local-cluster[2,1,1024]", 2) == 2 and task_slots("local[*]", 2) == 2
    for master in ("local-cluster[2,1,1024]", "local[*]", "local[2]"):
        with pytest.raises(ConfigError, match="needs 3 at once for 3 ranks"):
            check_placeable(equivalence_config(tmp_path, strategy="bsp", workers=2,
                                               launcher="spark", master=master), 2)
    check_placeable(equivalence_config(tmp_path, strategy="bsp", workers=2, launcher="spark",
                                       master="spark://h:7077"), 2)  # its slots unknown
    with pytest.raises(ConfigError, match="cannot go on without a lost worker"):
        check_placeable(equivalence_config(tmp_path, strategy="asp", workers=2,
                                           launcher="spark", on_worker_failure="continue"), 2)
    with pytest.raises(ConfigError, match="takes no emulated hosts"):
        check_placeable(equivalence_config(tmp_path, workers=2, launcher="spark", hosts=2), 2)


def test_the_rank_that_explains_a_failure_names_it(tmp_path):
    """Without Spark: the ranks' exit codes and reports as the driver reads them."""
    record, topology = RunRecord(tmp_path, "run"), Topology(1, 2)
    lost = {r: RankFailure(r, Kind.LOST, "PeerLost: connection reset") for r in (0, 1)}
    # Rank 2 killed: its peers' broken connections are its doing.
    codes = {0: 1, 1: 1, 2: -signal.SIGKILL}
    assert explained(codes, lost) and not explained({0: 1, 1: 1}, lost)
    failure_of_2 = "rank 2 (worker 1) was killed by SIGKILL"
    assert str(ranks_failure(codes, lost, topology, record)) == failure_of_2
    # Rank 0 reported its lost peer, then aborted on its way out: that explains nothing, and
    # the killed rank is still the one named once its code comes.
    assert not explained({0: -signal.SIGABRT}, lost)
    aborted = {0: -signal.SIGABRT, 2: -signal.SIGKILL}
    assert str(ranks_failure(aborted, lost, topology, record)) == failure_of_2
    # A rank's own error explains the others' lost peers, wherever it ran.
    own = {**lost, 2: RankFailure(2, Kind.BUG, "ValueError: bad")}
    assert "rank 2 (worker 1) raised ValueError: bad; traceback in" in str(
        ranks_failure({0: 1, 1: 1, 2: 1}, own, topology, record))
    # A rank's task lost in Spark (its Python worker killed, the rank with it): Spark's
    # error, naming the task, is the rank's.
    spark = Exception("Job aborted due to stage failure: ... Most recent failure reason: "
                      "Stage failed because barrier task ResultTask(0, 2) finished "
                      "unsuccessfully.\norg.apache.spark.SparkException: Python worker exited "
                      "unexpectedly (crashed)\n\tat org.apache.spark.api.python...")
    assert str(task_failure(spark, topology)) == ("rank 2 (worker 1): a Spark task raised "
                                                  "SparkException: Python worker exited "
                                                  "unexpectedly (crashed)")
    assert host_of("127.0.0.1:4040") == "127.0.0.1" and host_of("[::1]:4040") == "::1"
    assert host_of("node7") == "node7"


def ranks_listening() -> dict[int, set[tuple[str, int]]]:
    """The (host, port) each polyrhythm.node process this test started listens on, by rank."""
    found: dict[int, set[tuple[str, int]]] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            if "polyrhythm.node" in " ".join(process.cmdline()):
                found[int(process.environ()["RANK"])] = {
                    c.laddr[:2] for c in process.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue  # gone while looked at
    return found


def test_a_spark_ranks_store_listens_on_the_job_address_and_refuses_a_stranger(tmp_path):
    """Without Spark: two ranks as their barrier tasks start them (RankTask.run), meeting on
    loopback (every task on one host). Rank 0's store listens on loopback only, never on
    every interface; a stranger with the wrong secret is refused, named in rank 0's log, and
    the run completes. Rank 1 starts only after the stranger has tried: rank 0's store is
    up the while."""
    from polyrhythm.launch.launchers.spark_task import RankTask, free_port
    from polyrhythm.metrics.records import start_run

    config = equivalence_config(tmp_path, strategy="allreduce", workers=2, epochs=1,
                                steps_per_epoch=3, dataset="digits")
    record = start_run(config)
    secret = {"POLYRHYTHM_SECRET": os.urandom(32).hex()}  # as the driver gives it
    task = RankTask(str(record.dir / "config.toml"), record.run_id, str(record.dir / "logs"),
                    str(tmp_path), {RUN_VARIABLE: record.run_id, **secret})
    port, codes = free_port(), {}

    def run(rank: int) -> None:
        codes[rank] = task.run(rank, 2, "127.0.0.1", port)

    first = threading.Thread(target=run, args=(0,), daemon=True)
    first.start()
    deadline = time.monotonic() + HANG_GUARD_S
    heard: set[tuple[str, int]] = set()
    while not any(p == port for _, p in heard):
        assert first.is_alive() and time.monotonic() < deadline, "rank 0's store never listened"
        heard = ranks_listening().get(0, set())
        time.sleep(0.05)
    assert all(host == "127.0.0.1" for host, _ in heard), heard  # not 0.0.0.0 nor ::
    with pytest.raises((RuntimeError, dist.DistError)):  # a torch client of its own
        dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=2)).set("in", "1")
    from polyrhythm.launch.rank.gate import Relay

    with pytest.raises(ConfigError, match="refused this rank's proof of the run's secret"):
        Relay(b"a stranger's guess", ("127.0.0.1", port), HANG_GUARD_S)
    second = threading.Thread(target=run, args=(1,), daemon=True)
    second.start()
    while second.is_alive() and time.monotonic() < deadline:  # Gloo's and the relay too
        for rank, addresses in ranks_listening().items():
            assert all(host == "127.0.0.1" for host, _ in addresses), (rank, addresses)
        time.sleep(0.05)
    for thread in (first, second):
        thread.join(HANG_GUARD_S)
    assert codes == {0: 0, 1: 0}, (record.dir / "logs" / "rank0.log").read_text()[-2000:]
    log = (record.dir / "logs" / "rank0.log").read_text()
    assert "polyrhythm: refused a connection from 127.0.0.1:" in log
    assert "a wrong proof of the run's secret; the run goes on" in log
    assert record.store.run(record.run_id)["status"] == "completed"
