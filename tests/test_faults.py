"""Seeded fault injection: a killed worker or an interrupted launcher ends the whole run."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import HANG_GUARD_S, finished, give_up, wait_for_checkpoint, wait_for_ranks
from polyrhythm.config import load_config
from polyrhythm.metrics.store import RunStore

LONG_RUN = ["--workers", "2", "--epochs", "1000", "--dataset", "digits"]  # killed long before
CONFIG = load_config(workers=2, epochs=1000, dataset="digits")


def start_cli(tmp_path, *args):
    cmd = [sys.executable, "-m", "polyrhythm.cli", "train", "--out", str(tmp_path), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_training(tmp_path) -> tuple[subprocess.Popen, dict[int, psutil.Process]]:
    """LONG_RUN, once it trains (a complete checkpoint of its first epoch, every rank up):
    the launcher and {rank: process}."""
    launcher = start_cli(tmp_path, *LONG_RUN)
    wait_for_checkpoint(tmp_path, launcher, CONFIG.workers, CONFIG.servers)
    return launcher, wait_for_ranks(launcher, CONFIG.world_size)


def assert_all_gone(processes) -> None:
    gone, alive = psutil.wait_procs(list(processes), timeout=HANG_GUARD_S)
    assert alive == [], f"processes outlived the run: {alive}"


def only_run(tmp_path) -> dict:
    (run,) = RunStore(tmp_path / "polyrhythm.db").runs()
    return run


def test_sigkill_of_a_worker_fails_the_run_naming_the_rank(tmp_path):
    launcher, ranks = start_training(tmp_path)
    ranks[2].send_signal(signal.SIGKILL)
    _, err = finished(launcher, "after worker 1 was killed")
    # It ended because of the kill (1000 epochs were configured), and says so in one line.
    assert launcher.returncode == 1
    assert "rank 2 (worker 1) was killed by SIGKILL" in err
    assert "Traceback" not in err
    assert_all_gone(ranks.values())
    run = only_run(tmp_path)
    assert run["status"] == "failed"
    assert "rank 2 (worker 1) was killed by SIGKILL" in run["error"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_launcher_stops_every_process(tmp_path, sig):
    launcher, ranks = start_training(tmp_path)
    launcher.send_signal(sig)
    _, err = finished(launcher, f"after {sig.name}")
    assert launcher.returncode != 0
    assert "interrupted" in err
    assert "Traceback" not in err
    assert_all_gone(ranks.values())
    assert only_run(tmp_path)["status"] == "failed"


def test_ranks_die_with_a_sigkilled_launcher(tmp_path):
    launcher = start_cli(tmp_path, *LONG_RUN)
    wait_for_ranks(launcher, CONFIG.world_size)
    # The ranks and every helper process (the forkserver they fork from, multiprocessing's
    # resource tracker): none may outlive the launcher.
    descendants = psutil.Process(launcher.pid).children(recursive=True)
    launcher.kill()
    launcher.communicate()
    assert_all_gone(descendants)


def test_ranks_still_starting_leave_when_the_launcher_is_sigkilled(tmp_path):
    # Killed as soon as it has started a process (the forkserver, still importing torch, or
    # ranks that cannot have armed the death signal yet): every process it started leaves
    # instead of retrying the rendezvous for minutes.
    launcher = start_cli(tmp_path, *LONG_RUN)
    deadline = time.monotonic() + HANG_GUARD_S
    while not (children := psutil.Process(launcher.pid).children(recursive=True)):
        if launcher.poll() is not None or time.monotonic() > deadline:
            give_up(launcher, "its first process", HANG_GUARD_S)
        time.sleep(0.01)
    launcher.kill()
    launcher.communicate()
    # Well within the minutes a rendezvous would retry for (the config's timeout, 300 s).
    gone, alive = psutil.wait_procs(children, timeout=120)
    assert alive == [], f"processes outlived their launcher: {alive}"
