"""Chaos: a random process of a run SIGKILLed at a random moment of its start-up or training.
The run ends because of it (no hang: every other process ends) and the store names the dead
rank, or, where a lost worker lets the run go on (on_worker_failure = continue), the run
completes with the loss recorded; none of our processes remains."""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys

import psutil

from helpers import HANG_GUARD_S, finished, wait_for_checkpoint, wait_for_ranks
from polyrhythm.config import load_config
from polyrhythm.metrics.store import RunStore

STRATEGIES = ["bsp", "asp", "kbsp", "allreduce", "localsgd", "switch"]
# Each strategy once. Seed 9's draws kill a server, a worker a run goes on without, ranks
# at start-up and ranks after a checkpoint (benchmarks/soak.py kills a hundred runs).
RUNS = len(STRATEGIES)
EPOCHS = 14  # a kill lands by epoch 4 (rng.randint below): 10 or more epochs before the end


def test_a_random_process_killed_at_a_random_moment_ends_the_run_cleanly(tmp_path):
    rng = random.Random(9)  # the same chaos on every machine
    out = tmp_path / "runs"
    carried_on = 0
    for i in range(RUNS):
        strategy = STRATEGIES[i % len(STRATEGIES)]
        config = load_config(strategy=strategy, workers=3)
        earlier = frozenset(out.glob("2*"))
        launcher = subprocess.Popen(
            [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", strategy,
             "--workers", "3", "--dataset", "digits", "--epochs", str(EPOCHS), "--out", str(out),
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ranks = wait_for_ranks(launcher, config.world_size)
        family = psutil.Process(launcher.pid).children(recursive=True)
        # The moment is set by the run's progress, not by a sleep the run may outlast: while
        # the job starts (epoch 0) or once an early epoch has been checkpointed, 10 or more
        # of the EPOCHS epochs before the end, on any machine (the kill follows the
        # checkpoint by milliseconds; an epoch of digits takes about 0.2 s here). Earlier
        # runs' folders are in `out` too: only this run's checkpoints count.
        epoch = rng.randint(0, 4)
        if epoch:
            wait_for_checkpoint(out, launcher, config.workers, config.servers, epoch, earlier)
        rank = rng.choice(sorted(ranks))
        ranks[rank].send_signal(signal.SIGKILL)
        stdout, stderr = finished(launcher, f"after rank {rank} was killed ({strategy})")
        may_go_on = config.on_worker_failure == "continue" and rank >= config.servers
        if launcher.returncode == 0:  # went on without the worker: a loss, recorded
            assert may_go_on, (strategy, rank)
            summary = json.loads(stdout.splitlines()[-1])
            assert [w["rank"] for w in summary["lost_workers"]] == [rank], summary
            epochs = RunStore(out / "polyrhythm.db").epochs(summary["run_id"])
            # Every epoch recorded with a finite validation loss; a training loss wherever a
            # worker trained (kbsp's quorum uses up its rounds before the workers' last
            # epochs: no training loss is recorded for those, as without any loss).
            assert len(epochs) == EPOCHS and all(math.isfinite(e["val_loss"]) for e in epochs)
            trained = [e["train_loss"] for e in epochs if e["train_loss"] is not None]
            assert len(trained) >= 2 * EPOCHS // 3, epochs
            assert all(math.isfinite(x) for x in trained), epochs
            assert math.isfinite(summary["final_val_loss"])
            carried_on += 1
        else:  # it ended because of the kill (EPOCHS epochs were configured), naming the rank
            assert launcher.returncode == 1 and stderr.count("\n") == 1, (strategy, stderr)
            assert f"rank {rank} (" in stderr and "killed by SIGKILL" in stderr, stderr
            (run_dir,) = set(out.glob("2*")) - earlier
            row = RunStore(out / "polyrhythm.db").run(run_dir.name)
            assert row["status"] == "failed" and f"rank {rank} (" in row["error"], row
        _, alive = psutil.wait_procs(family, timeout=HANG_GUARD_S)
        assert not alive, (strategy, alive)
    assert carried_on, "no run went on without its lost worker"
    rows = RunStore(out / "polyrhythm.db").runs()
    assert len(rows) == RUNS
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == RUNS - carried_on
    assert all("killed by SIGKILL" in r["error"] for r in failed)

