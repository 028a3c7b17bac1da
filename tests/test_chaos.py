"""Chaos: a random process of a run SIGKILLed at a random moment of its start-up or training.
Every other process ends within 30 s and the store names the dead rank, or, where a lost worker
lets the run go on (on_worker_failure = continue), the run completes with the loss recorded;
none of our processes remains."""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import time

import psutil

from helpers import rank_processes
from polyrhythm.config import load_config
from polyrhythm.metrics.store import RunStore

STRATEGIES = ["bsp", "asp", "kbsp", "allreduce", "localsgd", "switch"]
RUNS = 10


def test_a_random_process_killed_at_a_random_moment_ends_the_run_cleanly(tmp_path):
    rng = random.Random(13)  # the same chaos on every machine
    out = tmp_path / "runs"
    carried_on = 0
    for i in range(RUNS):
        strategy = STRATEGIES[i % len(STRATEGIES)]
        config = load_config(strategy=strategy, workers=3)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", strategy,
             "--workers", "3", "--dataset", "digits", "--epochs", "30", "--out", str(out),
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        parent = psutil.Process(launcher.pid)
        ranks = {}
        deadline = time.monotonic() + 60
        while len(ranks) < config.world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            ranks = rank_processes(launcher.pid)
        assert len(ranks) == config.world_size, (strategy, ranks)
        family = parent.children(recursive=True)
        # The moment is set by the run's progress, not by a sleep the run may outlast: while
        # the job starts (epoch 0) or once an early epoch has been checkpointed, 20 or more
        # of the 30 epochs before the end, on any machine.
        _wait_for_epoch(out, rng.randint(0, 10), launcher)
        rank = rng.choice(sorted(ranks))
        ranks[rank].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = launcher.communicate(timeout=120)
        may_go_on = config.on_worker_failure == "continue" and rank >= config.servers
        if launcher.returncode == 0:  # went on without the worker: a loss, recorded
            assert may_go_on, (strategy, rank)
            summary = json.loads(stdout.splitlines()[-1])
            assert [w["rank"] for w in summary["lost_workers"]] == [rank], summary
            epochs = RunStore(out / "polyrhythm.db").epochs(summary["run_id"])
            # Every epoch recorded with a finite validation loss; a training loss wherever a
            # worker trained (kbsp's quorum uses up its rounds before the workers' last
            # epochs: no training loss is recorded for those, as without any loss).
            assert len(epochs) == 30 and all(math.isfinite(e["val_loss"]) for e in epochs)
            trained = [e["train_loss"] for e in epochs if e["train_loss"] is not None]
            assert len(trained) >= 20 and all(math.isfinite(x) for x in trained), epochs
            assert math.isfinite(summary["final_val_loss"])
            carried_on += 1
        else:  # every other process stopped within 30 s, the dead rank named
            assert time.monotonic() - killed <= 30, (strategy, rank)
            assert launcher.returncode == 1 and stderr.count("\n") == 1, (strategy, stderr)
            assert f"rank {rank} (" in stderr and "killed by SIGKILL" in stderr, stderr
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, (strategy, alive)
    assert carried_on, "no run went on without its lost worker"
    rows = RunStore(out / "polyrhythm.db").runs()
    assert len(rows) == RUNS
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == RUNS - carried_on
    assert all("killed by SIGKILL" in r["error"] for r in failed)


def _wait_for_epoch(out, epoch: int, launcher: subprocess.Popen) -> None:
    """Return once the run has checkpointed `epoch` or a later one (at once for 0: the job is
    starting); checkpoints are pruned as the run goes on, so any later one counts."""
    deadline = time.monotonic() + 60
    while epoch and time.monotonic() < deadline and launcher.poll() is None:
        done = [int(d.name.removeprefix("epoch-")) for d in out.glob("*/checkpoints/epoch-*")]
        if max(done, default=0) >= epoch:
            return
        time.sleep(0.01)
    assert not epoch or launcher.poll() is None, "the run ended before the moment to kill"
