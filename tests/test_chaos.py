"""Chaos: a random process of a run SIGKILLed at a random moment. Every other process ends
within 30 s, none of ours remains, and the store names the dead rank."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import psutil

from helpers import rank_processes
from polyrhythm.metrics.store import RunStore

STRATEGIES = ["bsp", "asp", "kbsp", "allreduce", "localsgd", "switch"]
RUNS = 10


def test_a_random_process_killed_at_a_random_moment_ends_the_run_cleanly(tmp_path):
    rng = random.Random(13)  # the same chaos on every machine
    out = tmp_path / "runs"
    for i in range(RUNS):
        strategy = STRATEGIES[i % len(STRATEGIES)]
        launcher = subprocess.Popen(
            [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", strategy,
             "--workers", "3", "--dataset", "digits", "--epochs", "30", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        parent = psutil.Process(launcher.pid)
        ranks = {}
        deadline = time.monotonic() + 60
        while len(ranks) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
            ranks = rank_processes(launcher.pid)
        family = parent.children(recursive=True)
        time.sleep(rng.uniform(0.2, 2.5))  # starting up, training or between epochs
        rank = rng.choice(sorted(ranks))
        ranks[rank].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert time.monotonic() - killed <= 30, (strategy, rank)
        assert launcher.returncode == 1 and stderr.count("\n") == 1, (strategy, stderr)
        assert f"rank {rank} (" in stderr and "killed by SIGKILL" in stderr, stderr
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, (strategy, alive)
    rows = RunStore(out / "polyrhythm.db").runs()
    assert len(rows) == RUNS and all(r["status"] == "failed" for r in rows)
    assert all("killed by SIGKILL" in r["error"] for r in rows)
