"""The emulated cluster: namespaces, shaped links, CPU groups and torchrun in each host. Runs
only as root with `ip` and `tc` (CI runs as root); skipped with the reason otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import polyrhythm
from helpers import equivalence_config, max_diff, needs_emulated_cluster, stored_parameters
from polyrhythm import api
from polyrhythm.cli import main
from polyrhythm.cli.train import cluster_line
from polyrhythm.errors import ClusterError, RunFailed
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, leftovers
from polyrhythm.metrics.records import RunRecord
from polyrhythm.metrics.store import RunStore
from script_reference import SCRIPT, farthest, one_process

pytestmark = needs_emulated_cluster


@pytest.fixture(autouse=True)
def before():
    """What of ours was on the machine before the test (a standing cluster someone keeps);
    each test must leave exactly that."""
    found = leftovers()
    yield found
    assert leftovers() == found


@pytest.mark.parametrize(("strategy", "workers"), [("bsp", 2), ("asp", 1), ("allreduce", 2)])
def test_a_run_across_two_hosts_ends_as_the_same_run_on_loopback(tmp_path, strategy, workers,
                                                                  before, capsys):
    fields = {"strategy": strategy, "workers": workers, "epochs": 1}
    local = polyrhythm.train(equivalence_config(tmp_path, **fields))
    cluster = polyrhythm.train(equivalence_config(tmp_path, hosts=2, **fields))
    assert cluster["status"] == "completed"
    assert len(cluster["cluster"]["hosts"]) == 2
    assert cluster["cluster"]["name"] is None and "standing" not in capsys.readouterr().err
    assert cluster_line(cluster["cluster"]).startswith("emulated cluster of 2 hosts; ")
    assert max_diff(stored_parameters(cluster), stored_parameters(local)) <= 1e-4


@pytest.mark.parametrize(("fields", "layout"), [
    ({"strategy": "bsp", "servers": 1}, [[0], [1, 2]]),
    ({"strategy": "allreduce"}, [[0], [1]]),
    # A server beside each worker: torchrun numbers host 1's processes 2 and 3, the job
    # ranks there are 1 and 3 (server 1, worker 1), and worker 0 is host 0's second.
    ({"strategy": "bsp", "placement": "collocated"}, [[0, 2], [1, 3]]),
], ids=["bsp", "allreduce", "bsp-collocated"])
def test_a_script_on_two_hosts_trains_what_one_process_trains(tmp_path, fields, layout,
                                                                capfd):
    """A user's script as every rank on an emulated cluster (polyrhythm run --hosts): each
    run is synchronous, so it trains what one process trains on the union batch; the
    record has the cluster, and worker 0's output (only its) is shown."""
    summary = api.run_script(SCRIPT, [], {"out": str(tmp_path / "runs"), "seed": 0,
                                          "workers": 2, "hosts": 2, **fields})
    assert summary["status"] == "completed" and summary["cluster"]["layout"] == layout
    assert cluster_line(summary["cluster"]).startswith("emulated cluster of 2 hosts; ")
    model = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert farthest(model, one_process(workers=2)) <= 1e-5
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
    shown = [line for line in capfd.readouterr().out.splitlines() if "epoch" in line]
    assert shown == [f"worker 0: epoch {e} done" for e in range(1, 5)]


def test_a_script_that_raises_on_the_cluster_names_the_worker_and_leaves_nothing(tmp_path):
    """Worker 1 raises in epoch 2: its torchrun stops its host, the launcher the rest; the
    error names the worker and the script's line as on loopback (not server 0, which lost
    every worker), and no process, namespace, qdisc or cgroup is left (the fixture)."""
    with pytest.raises(RunFailed) as failed:
        api.run_script(SCRIPT, ["--fault", "raise"], {"out": str(tmp_path / "runs"),
                                                      "strategy": "asp", "servers": 1,
                                                      "workers": 2, "hosts": 2})
    message = str(failed.value)
    assert "rank 2 (worker 1) raised ValueError: the user's own bug (user_loop.py, line" \
        in message and "\n" not in message, message
    # Its checkpoint after epoch 1 lets it go on, on the cluster, as `polyrhythm run` does.
    run_id = _stored(tmp_path)["run_id"]
    assert message.endswith(f"`polyrhythm run --resume {run_id} --out {tmp_path / 'runs'}` "
                            "goes on after epoch 1"), message
    log = message.split("traceback in ")[1].split(";")[0]
    assert log.endswith("logs/host1.log")  # worker 1's host: its traceback is there
    assert "ValueError: the user's own bug" in Path(log).read_text()
    assert _stored(tmp_path)["status"] == "failed"
    assert subprocess.run(["pgrep", "-f", str(SCRIPT)], capture_output=True).stdout == b""


def test_a_standing_cluster_is_shaped_listed_used_and_removed(tmp_path, before, capsys):
    shape = ClusterShape(2, ("100mbit", "1gbit"), (0.5, 0.5))
    cluster = EmulatedCluster("testup", shape)
    cluster.up(standing=True)
    try:
        made = leftovers()
        new = {key: [x for x in made[key] if x not in before[key]] for key in made}
        assert sorted(new["namespaces"]) == ["pr-testup-h0", "pr-testup-h1"]
        assert len(new["links"]) == 3  # the bridge and the bridge's end of each link
        rates = sorted(line.split(" rate ")[1].split()[0] for line in new["qdiscs"])
        assert rates == ["100Mbit", "1Gbit"]  # the bridge's ends; the hosts' are inside
        for namespace in new["namespaces"]:  # Reno, not this machine's default (BBR here)
            assert subprocess.run(
                ["ip", "netns", "exec", namespace, "sysctl", "-n",
                 "net.ipv4.tcp_congestion_control"], capture_output=True, text=True,
                check=True).stdout.strip() == "reno"
        assert [_quota(cluster.host_group(h)) for h in (0, 1)] == [(50_000, 100_000)] * 2
        summary = polyrhythm.train(equivalence_config(
            tmp_path, strategy="asp", workers=1, epochs=1, hosts=2,
            bandwidth=["100mbit", "1gbit"], cpu=[0.5]))
        assert summary["status"] == "completed" and summary["cluster"]["name"] == "testup"
        assert capsys.readouterr().err.splitlines() == [
            "polyrhythm: on the standing cluster 'testup' (2 hosts: 100mbit link, 0.5 cores; "
            "1gbit link, 0.5 cores), not one of the run's own"]
        assert cluster_line(summary["cluster"]).startswith("standing cluster 'testup' of 2 "
                                                           "hosts; ")
        assert summary["cluster"]["tcp"] == "reno"
        assert leftovers() == made  # the run removed its own groups, not the cluster's
    finally:
        cluster.down()
    assert leftovers() == before


def _quota(group) -> tuple[int, int]:
    """A group's CPU quota and period in µs, as the kernel shows them in the files of the
    machine's hierarchy (v1: cpu.cfs_quota_us and cpu.cfs_period_us; v2: cpu.max)."""
    if group.version == 1:
        return tuple(int((group.path / f"cpu.cfs_{name}_us").read_text())
                     for name in ("quota", "period"))
    quota, period = (group.path / "cpu.max").read_text().split()
    return int(quota), int(period)


def _launch(tmp_path, *flags) -> subprocess.Popen:
    command = [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", "bsp",
               "--workers", "2", "--hosts", "2", "--compute", "emulated", "--compute-time",
               "100ms", "--epochs", "50", "--out", str(tmp_path / "runs"), *flags]
    return subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ranks_of(run_dir) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with_run = " ".join(p.info["cmdline"] or [])
        if "polyrhythm.node" in with_run and str(run_dir) in with_run:
            found.append(p)
    return found


def _wait_for_ranks(tmp_path, launcher, count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.stderr.read()
        if len(_ranks_of(tmp_path / "runs")) >= count:
            return
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


def _wait_until_clean(tmp_path, before) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (leftovers() != before or _ranks_of(tmp_path)):
        time.sleep(0.2)


def _stored(tmp_path) -> dict:
    (run,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    return run


def _assert_stopped_cleanly(tmp_path, before, error: str) -> None:
    _wait_until_clean(tmp_path, before)
    assert leftovers() == before and not _ranks_of(tmp_path)
    run = _stored(tmp_path)
    assert run["status"] == "failed" and error in run["error"]


def test_a_killed_launcher_leaves_nothing_behind_and_the_run_failed(tmp_path, before):
    launcher = _launch(tmp_path)
    # 3 ranks (1 server, 2 workers) plus the 2 torchruns that started them.
    _wait_for_ranks(tmp_path, launcher, 5)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    _assert_stopped_cleanly(tmp_path, before, "launcher was killed")


def test_ctrl_c_stops_the_run_and_leaves_nothing_behind(tmp_path, before):
    launcher = _launch(tmp_path)
    _wait_for_ranks(tmp_path, launcher, 5)
    os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode != 0 and "interrupted" in err, err
    assert "Traceback" not in err
    _assert_stopped_cleanly(tmp_path, before, "interrupted")


def test_a_failing_host_fails_the_run_with_its_reason_and_leaves_nothing(tmp_path, before):
    # A rank dies as on a real cluster: its torchrun reports it, the launcher stops the rest.
    launcher = _launch(tmp_path)
    _wait_for_ranks(tmp_path, launcher, 5)
    victim = next(p for p in _ranks_of(tmp_path / "runs")
                  if "torch.distributed.run" not in " ".join(p.cmdline()))
    victim.kill()
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert "host" in err and "failed" in err and "Traceback" not in err
    _assert_stopped_cleanly(tmp_path, before, "failed")


@pytest.mark.parametrize(("patch", "message"), [
    (("os.geteuid", lambda: 1000), "needs root"),
    (("shutil.which", lambda tool: None), "needs ip, tc, sysctl"),
])
def test_without_root_or_tools_a_cluster_run_is_one_clear_line_and_no_record(
        tmp_path, monkeypatch, patch, message):
    monkeypatch.setattr(*patch)
    with pytest.raises(ClusterError, match=message):
        polyrhythm.train(equivalence_config(tmp_path, workers=1, hosts=2))
    assert not (tmp_path / "runs" / "polyrhythm.db").exists()


def test_if_the_launcher_cannot_remove_all_the_janitor_does_at_once(tmp_path, monkeypatch,
                                                                    before):
    from polyrhythm.launch.cluster.cgroups import CpuGroup

    calls = []

    def failing(self):  # in this process only: the launcher can remove no group
        calls.append(self.path)
        raise ClusterError(f"cannot remove cgroup {self.path}: Device or resource busy")

    monkeypatch.setattr(CpuGroup, "remove", failing)
    summary = polyrhythm.train(equivalence_config(tmp_path, strategy="asp", workers=1,
                                                  epochs=1, hosts=2))
    assert summary["status"] == "completed" and calls
    assert leftovers() == before  # the janitor (another process, unpatched) removed the rest


@pytest.fixture
def cluster_cli(capsys):
    """`polyrhythm cluster ARGS` through the command line's own code (polyrhythm.cli.main) in
    this process, not an interpreter of its own for each of a test's commands: its exit code
    and what it printed."""
    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main(["cluster", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["cluster", *args], code, out, err)
    return run


def test_cluster_up_status_and_down_from_the_command_line(tmp_path, before, cluster_cli):
    up = cluster_cli("up", "--name", "clitest", "--hosts", "2", "--bandwidth", "100mbit",
              "--cpu", "0.5")
    assert up.returncode == 0, up.stderr
    try:
        status = cluster_cli("status").stdout
        assert "cluster clitest:" in status
        assert "host 1: pr-clitest-h1 10.213.0.2  100mbit link, 0.5 cores" in status
        assert _quota(EmulatedCluster.standing("clitest").host_group(1)) == (50_000, 100_000)
        again = cluster_cli("up", "--name", "clitest", "--hosts", "2")
        assert again.returncode == 2
        assert again.stderr.strip() == "polyrhythm: error: cluster 'clitest' is already up"
    finally:
        down = cluster_cli("down", "--name", "clitest")
    assert down.returncode == 0 and "cluster clitest is down" in down.stdout
    assert leftovers() == before
    assert "clitest" not in cluster_cli("status").stdout
    for bad, message in ((["--hosts", "2", "--bandwidth", "100mbps"], "such as 100mbit"),
                         (["--hosts", "2", "--cpu", "1", "1", "1"], "one per host (2), got 3"),
                         (["--bandwidth", "1gbit"], "needs --hosts")):
        done = cluster_cli("up", "--name", "clitest", *bad)
        assert done.returncode == 2 and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    config = tmp_path / "run.toml"
    config.write_text('workers = 4\n[cluster]\nworkers_per_host = 2\nlatency = "5ms"\n'
                      'bandwidth = "1gbit"\n')
    from_run = cluster_cli("up", "--name", "clitest", "--config", str(config))
    assert from_run.returncode == 0, from_run.stderr  # 2 worker hosts + 1 server's
    assert from_run.stdout.count("1gbit link") == 3
    cluster_cli("down", "--name", "clitest")
    gone = cluster_cli("down", "--name", "clitest")  # nothing to remove: said, and no error
    assert (gone.returncode, gone.stdout, gone.stderr) == (
        0, "no standing cluster 'clitest': nothing to remove\n", "")


def test_cluster_down_without_root_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["cluster", "down", "--name", "clitest"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "needs root" in err
