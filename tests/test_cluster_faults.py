"""Faults on an emulated cluster, as a real cluster meets them: a run resumed on its hosts, a
worker host lost (its processes killed, or its link down for good) that an asp run goes on
without, a lost server host, and links down for a moment or past the timeout. Runs only as
root with `ip` and `tc`; skipped with the reason otherwise."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import polyrhythm
from helpers import (
    finished,
    max_diff,
    needs_emulated_cluster,
    stored_parameters,
    wait_for_checkpoint,
)
from polyrhythm import api
from polyrhythm.errors import RunFailed
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, leftovers
from polyrhythm.metrics.store import RunStore
from polyrhythm.runtime.checkpoint import complete_epochs, epoch_dir
from script_reference import SCRIPT

pytestmark = needs_emulated_cluster

# Quick runs, each worker's steps slowed a little so that a fault lands between checkpoints.
RUN = {"dataset": "digits", "steps_per_epoch": 10, "threads": 1, "worker_delay_s": "0.03,0.03",
       "lr_decay_every": 1, "lr_decay": 0.5}


@pytest.fixture(scope="module")
def clusters():
    """Standing clusters of 2 and 3 hosts, whose links the tests take down, used by every
    run of this module (a run of the same shape takes a standing cluster); removed after,
    leaving what was there before."""
    before = leftovers()
    made = {}
    try:
        for hosts in (2, 3):
            made[hosts] = EmulatedCluster(f"faults{hosts}",
                                          ClusterShape(hosts, (None,) * hosts, (None,) * hosts))
            made[hosts].up(standing=True)
        yield made
    finally:
        for cluster in made.values():
            cluster.down()
    assert leftovers() == before


@pytest.fixture(autouse=True)
def links_back_up(clusters):
    """Every link up again after each test, whatever it did."""
    yield
    for cluster in clusters.values():
        for host in cluster.links_down():
            cluster.set_link(host, True)


def _launch(out: Path, **fields) -> subprocess.Popen:
    args = [sys.executable, "-m", "polyrhythm.cli", "train", "--out", str(out), "--json"]
    for key, value in {**RUN, **fields}.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stopped(launcher: subprocess.Popen) -> list[psutil.Process]:
    """Every process under `launcher` (its hosts' torchruns and ranks), stopped."""
    stopped = []
    for process in psutil.Process(launcher.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.suspend()
            stopped.append(process)
    return stopped


def _completed(out: Path, stdout: str, epochs: int) -> dict:
    """The summary `polyrhythm train --json` printed, of a run completed with all its epochs
    recorded."""
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    assert len(RunStore(out / "polyrhythm.db").epochs(summary["run_id"])) == epochs
    return summary


def test_a_run_resumed_on_two_hosts_ends_where_an_uninterrupted_one_ends(tmp_path, clusters):
    """bsp on 2 hosts (the server on one, both workers on the other): the workers' host is
    lost after the checkpoint of epoch 2 of 4; the run fails saying how to go on, and goes
    on on the cluster from that checkpoint to where the uninterrupted run ends (on loopback,
    which a run on the cluster ends as: test_cluster.py)."""
    job = {"strategy": "bsp", "servers": 1, "workers": 2, "epochs": 4}
    out, fields = tmp_path / "runs", {**job, "hosts": 2}
    launcher = _launch(out, **fields)
    run_dir, _ = wait_for_checkpoint(out, launcher, 2, 1, epochs=2)
    clusters[2].host_group(1).kill()  # every process of host 1: its torchrun and ranks
    _, stderr = finished(launcher, "after host 1 was lost")
    assert launcher.returncode == 1, stderr
    assert "host 1 (ranks 1, 2) was killed by SIGKILL" in stderr, stderr
    assert f"`polyrhythm train --resume {run_dir.name} --out {out}` goes on after" in stderr
    for later in complete_epochs(run_dir, 2, 1):  # the loss may have come later
        if later > 2:
            shutil.rmtree(epoch_dir(run_dir, later))
    said = []
    summary = polyrhythm.resume(run_dir.name, out, say=said.append)
    assert said[-1] == f"resuming run {run_dir.name} after epoch 2 of 4"
    assert summary["status"] == "completed" and len(summary["epoch_metrics"]) == 4
    assert summary["cluster"]["layout"] == [[0], [1, 2]]
    # Its steps unslowed (the delay is a sleep: the same arithmetic), and not on the cluster
    # again, whose torchruns and ranks starting were a third of the test.
    whole = polyrhythm.train({**RUN, **job, "worker_delay_s": None,
                              "out": str(tmp_path / "whole")})
    assert max_diff(stored_parameters(summary), stored_parameters(whole)) <= 1e-5


@pytest.mark.parametrize(("strategy", "how"), [
    ("asp", "killed"), ("asp", "cut off"), ("allreduce", "killed"), ("allreduce", "cut off"),
    ("bsp", "killed"), ("ssp", "killed"), ("localsgd", "killed"), ("dpsgd", "killed"),
    ("switch", "killed"), ("asp", "rank killed"), ("allreduce", "rank killed")])
def test_a_run_on_three_hosts_goes_on_without_a_lost_worker_host(tmp_path, clusters, strategy,
                                                                 how):
    """A parameter-server strategy (or switch, which ends as asp) with its server on host 0
    and a worker on each of hosts 1 and 2, or a collective or decentralised one with a
    worker on each host, told to
    continue: host 2 lost (its processes killed; or its link down for good, its worker then
    silent past the timeout) leaves the run going on without its worker to completion, the
    loss recorded with its host. Without servers the workers left regroup over the emulated
    links (comm/membership.py). A rank killed alone (as the kernel's OOM killer would),
    its torchrun left to end itself (exit code 1), is a loss as well: its torchrun's log
    says how it ended."""
    out = tmp_path / "runs"
    job = ({"strategy": strategy, "servers": 1, "workers": 2, "on_worker_failure": "continue"}
           if strategy in ("asp", "bsp", "ssp", "switch") else
           {"strategy": strategy, "workers": 3, "on_worker_failure": "continue",
            "worker_delay_s": "0.03,0.03,0.03"})
    launcher = _launch(out, **job, epochs=6, hosts=3, timeout=3)
    workers, servers = job["workers"], job.get("servers", 0)
    wait_for_checkpoint(out, launcher, workers, servers, epochs=1)
    if how == "killed":
        clusters[3].host_group(2).kill()
    elif how == "rank killed":
        (rank,) = [p for p in map(psutil.Process, clusters[3].host_group(2).pids())
                   if "polyrhythm.node" in p.cmdline()  # the rank, not its torchrun
                   and "torch.distributed.run" not in p.cmdline()]
        rank.kill()
    else:
        clusters[3].set_link(2, False)
    stdout, stderr = finished(launcher, f"after host 2 was {how}")
    assert launcher.returncode == 0, stderr
    summary = _completed(out, stdout, 6)
    gone = workers - 1  # the worker on host 2, rank 2 either way
    assert [lost["worker"] for lost in summary["lost_workers"]] == [gone]
    assert [(e["worker"], e["rank"], e["host"], e["cause"], e["workers"])
            for e in summary["membership"]] == [(gone, 2, 2, "lost", workers - 1)]
    # Cut off, it may time out itself before the run ends, or be ended by its launcher.
    said = (f"polyrhythm: host 2 (worker {gone}) lost: was killed by SIGKILL; the others go on"
            if how in ("killed", "rank killed") else
            f"polyrhythm: host 2 (worker {gone}) lost: its link is down; the ")
    assert said in stderr, stderr


def test_a_rank_killed_alone_fails_a_run_told_to_abort_naming_its_host(tmp_path, clusters):
    """allreduce on 3 hosts (abort, its default), worker 2's rank killed on cue after its
    step 12, its torchrun ending itself (exit code 1): the run fails naming host 2 and how
    its rank ended (its torchrun's log says), not a survivor that lost it as a peer."""
    out = tmp_path / "runs"
    launcher = _launch(out, strategy="allreduce", workers=3, epochs=3, hosts=3,
                       worker_delay_s="0.03,0.03,0.03", dies_after_steps="0,0,12")
    _, stderr = finished(launcher, "after worker 2's rank was killed")
    assert launcher.returncode == 1, stderr
    assert "failed: host 2 (ranks 2) was killed by SIGKILL" in stderr, stderr


def test_a_lost_server_host_fails_the_run_saying_how_to_go_on(tmp_path, clusters):
    """The server's host lost: no worker can go on; the run fails naming the host and how to
    go on (resumed as the 2-host run above)."""
    out = tmp_path / "runs"
    launcher = _launch(out, strategy="asp", servers=1, workers=2, epochs=4, hosts=3)
    run_dir, _ = wait_for_checkpoint(out, launcher, 2, 1, epochs=1)
    clusters[3].host_group(0).kill()
    _, stderr = finished(launcher, "after the server's host was lost")
    assert launcher.returncode == 1, stderr
    assert "host 0 (ranks 0) was killed by SIGKILL" in stderr, stderr
    assert f"--resume {run_dir.name}" in stderr
    (run,) = RunStore(out / "polyrhythm.db").runs()
    assert run["status"] == "failed" and "host 0 (ranks 0) was killed" in run["error"]


def test_a_link_down_for_less_than_the_timeout_costs_time_not_the_run(tmp_path, clusters):
    """A bsp, an asp and an allreduce run at once on the 2-host cluster, their workers on
    host 1 (allreduce's worker 1), whose link goes down for 2 s once each is training:
    every one carries on once it is back, and completes (benchmarks/outage.py: 5 s). Each
    run's processes are frozen (SIGSTOP) at its first checkpoint until all three have one,
    and thawed as the link goes down: a fast run cannot end before the outage, and none can
    step during it (every step crosses the link)."""
    jobs = {"bsp": 1, "asp": 1, "allreduce": 0}
    launchers = {name: _launch(tmp_path / name, strategy=name, servers=servers, workers=2,
                               epochs=10, hosts=2) for name, servers in jobs.items()}
    frozen = []
    for name, servers in jobs.items():
        wait_for_checkpoint(tmp_path / name, launchers[name], 2, servers, epochs=1)
        frozen += _stopped(launchers[name])
    clusters[2].set_link(1, False)
    for process in frozen:
        process.resume()
    down = time.monotonic()
    while time.monotonic() - down < 2:  # the outage, however long the runs last
        time.sleep(0.05)
    clusters[2].set_link(1, True)
    running = {name for name, launcher in launchers.items() if launcher.poll() is None}
    for name, launcher in launchers.items():
        stdout, stderr = finished(launcher, f"{name} after a 2 s outage")
        assert launcher.returncode == 0, (name, stderr)
        _completed(tmp_path / name, stdout, 10)
    assert running == set(jobs)  # the link came back while each went on


def test_a_link_down_past_the_timeout_fails_the_run_naming_the_host(tmp_path, clusters):
    """The workers' host cut off for good with --timeout 5: the run fails (no hang: how soon
    is benchmarks/outage.py's figure), naming the host whose link is down, and the run is
    recorded so."""
    out = tmp_path / "runs"
    launcher = _launch(out, strategy="bsp", servers=1, workers=2, epochs=50, hosts=2,
                       timeout=5)
    wait_for_checkpoint(out, launcher, 2, 1, epochs=1)
    clusters[2].set_link(1, False)
    _, stderr = finished(launcher, "after its link went down for good")
    assert launcher.returncode == 1, stderr
    assert "host 1 (ranks 1, 2) was cut off: its link is down" in stderr, stderr
    (run,) = RunStore(out / "polyrhythm.db").runs()
    assert run["status"] == "failed" and "was cut off" in run["error"]


def test_a_script_run_resumed_on_two_hosts_ends_with_the_uninterrupted_runs_model(
        tmp_path, clusters):
    """A user's script on 2 hosts (bsp, its server on one, its workers on the other) fails
    once in epoch 3; `polyrhythm run --resume` goes on on the cluster and ends with the
    model an uninterrupted run on loopback ends with."""
    job = {"strategy": "bsp", "servers": 1, "workers": 2, "seed": 0}
    with pytest.raises(RunFailed) as failed:  # its schedule kept in the checkpoints
        api.run_script(SCRIPT, ["--keep", str(tmp_path / "tally"),
                                "--fail-once", str(tmp_path / "failed-once")],
                       {**job, "hosts": 2, "out": str(tmp_path / "runs")})
    run_id = failed.value.run_id
    assert f"`polyrhythm run --resume {run_id} --out" in str(failed.value)
    summary = api.resume_script(run_id, tmp_path / "runs", say=lambda line: None)
    assert summary["status"] == "completed" and summary["cluster"]["layout"] == [[0], [1, 2]]
    whole = api.run_script(SCRIPT, ["--keep", str(tmp_path / "whole-tally")],
                           {**job, "out": str(tmp_path / "whole")})
    resumed, model = (torch.load(Path(s["run_dir"]) / "model.pt") for s in (summary, whole))
    assert max(max_diff(resumed[k], model[k]) for k in model) <= 1e-5
