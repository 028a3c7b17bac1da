"""Seeded fault injection: a killed worker or an interrupted launcher ends the whole run."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import rank_processes as launcher_ranks
from polyrhythm.metrics.store import RunStore

LONG_RUN = ["--workers", "2", "--epochs", "1000", "--dataset", "digits"]  # killed long before


def start_cli(tmp_path, *args):
    cmd = [sys.executable, "-m", "polyrhythm.cli", "train", "--out", str(tmp_path), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_processes(launcher: subprocess.Popen, count: int, timeout: float = 60) -> dict:
    """Wait until the launcher has `count` ranks running; return {rank: psutil.Process}."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = launcher_ranks(launcher.pid)
        if len(ranks) == count:
            return ranks
        time.sleep(0.1)
    launcher.kill()
    pytest.fail(f"launcher did not start {count} ranks in {timeout} s")


def wait_for_training(tmp_path, timeout: float = 60) -> None:
    """Wait until rank 0 is past set-up (the run directory exists and time has passed)."""
    deadline = time.monotonic() + timeout
    while not list(tmp_path.glob("*/config.toml")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(4)  # data loaded, process group up, steps under way


def assert_all_gone(processes) -> None:
    gone, alive = psutil.wait_procs(list(processes), timeout=5)
    assert alive == [], f"processes outlived the run: {alive}"


def only_run(tmp_path) -> dict:
    (run,) = RunStore(tmp_path / "polyrhythm.db").runs()
    return run


def test_sigkill_of_a_worker_fails_the_run_naming_the_rank(tmp_path):
    launcher = start_cli(tmp_path, *LONG_RUN)
    ranks = rank_processes(launcher, 3)
    wait_for_training(tmp_path)
    assert launcher.poll() is None, "the run ended before the fault was injected"
    killed_at = time.monotonic()
    ranks[2].send_signal(signal.SIGKILL)
    _, err = launcher.communicate(timeout=30)
    assert time.monotonic() - killed_at < 30
    assert launcher.returncode != 0
    assert "rank 2 (worker 1) was killed by SIGKILL" in err
    assert "Traceback" not in err
    assert_all_gone(ranks.values())
    run = only_run(tmp_path)
    assert run["status"] == "failed"
    assert "rank 2" in run["error"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_launcher_stops_every_process(tmp_path, sig):
    launcher = start_cli(tmp_path, *LONG_RUN)
    ranks = rank_processes(launcher, 3)
    wait_for_training(tmp_path)
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode != 0
    assert "interrupted" in err
    assert "Traceback" not in err
    assert_all_gone(ranks.values())
    assert only_run(tmp_path)["status"] == "failed"


def test_ranks_die_with_a_sigkilled_launcher(tmp_path):
    launcher = start_cli(tmp_path, *LONG_RUN)
    rank_processes(launcher, 3)
    # The ranks and every helper process (the forkserver they fork from, multiprocessing's
    # resource tracker): none may outlive the launcher.
    descendants = psutil.Process(launcher.pid).children(recursive=True)
    launcher.kill()
    launcher.wait(timeout=10)
    assert_all_gone(descendants)


def test_ranks_still_starting_leave_when_the_launcher_is_sigkilled(tmp_path):
    # Killed as soon as it has started a process (the forkserver, still importing torch, or
    # ranks that cannot have armed the death signal yet): every process it started leaves
    # instead of retrying the rendezvous for minutes.
    launcher = start_cli(tmp_path, *LONG_RUN)
    deadline = time.monotonic() + 60
    children = []
    while not children and time.monotonic() < deadline:
        children = psutil.Process(launcher.pid).children(recursive=True)
        time.sleep(0.01)
    assert children, "the launcher started no process"
    launcher.kill()
    launcher.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"processes outlived their launcher: {alive}"
