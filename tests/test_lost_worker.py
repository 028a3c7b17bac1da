"""on_worker_failure: a worker killed mid-run, and whether the run goes on without it."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import polyrhythm
from helpers import (
    HANG_GUARD_S,
    finished,
    rank_processes,
    small_config,
    wait_for_checkpoint,
    wait_for_ranks,
)
from polyrhythm.cli import main
from polyrhythm.config import load_config
from polyrhythm.errors import ConfigError
from polyrhythm.launch.process import forkserver
from polyrhythm.launch.process.events import RankEvents, send
from polyrhythm.launch.rank import life
from polyrhythm.metrics.store import RunStore
from polyrhythm.report import write_report
from polyrhythm.runtime.checkpoint import complete_epochs

EPOCHS = 6
WORKERS, SERVERS = 3, 1


def _kill_during_training(out, rank: int, *args: str,
                          servers: int = SERVERS) -> subprocess.CompletedProcess:
    """Run `polyrhythm train --json` on digits with 3 workers and a server, SIGKILL `rank`
    once every rank is up and the first epoch's checkpoint is complete (training is under
    way, EPOCHS - 1 epochs before its end); the finished command."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "polyrhythm.cli", "train", "--workers", str(WORKERS),
         "--dataset", "digits", "--epochs", str(EPOCHS), "--worker-delay-s", "0.01,0.01,0.01",
         "--json", "--out", str(out), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(out, launcher, WORKERS, servers)
    ranks = wait_for_ranks(launcher, WORKERS + servers)
    ranks[rank].send_signal(signal.SIGKILL)
    stdout, stderr = finished(launcher, f"after rank {rank} was killed")
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, stdout, stderr)


def _aborted(run: subprocess.CompletedProcess, out, rank: int, role: str,
             servers: int = SERVERS) -> None:
    """The run ended because `rank` was killed: one line naming it, the run recorded as
    failed for it, its newest checkpoint before the last epoch (training had not finished)."""
    said = f"rank {rank} ({role}) was killed by SIGKILL"
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and said in run.stderr, (
        run.stderr)
    (row,) = RunStore(out / "polyrhythm.db").runs()
    assert row["status"] == "failed" and said in row["error"], row
    assert complete_epochs(out / row["run_id"], WORKERS, servers)[-1] < EPOCHS


def _completed_without(run: subprocess.CompletedProcess, out, worker: int,
                       servers: int = SERVERS) -> dict:
    """The run went on without `worker` and completed: its summary."""
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.splitlines()[-1])
    (lost,) = summary["lost_workers"]
    assert lost["worker"] == worker and lost["rank"] == worker + servers
    assert lost["at_s"] > 0 and lost["pushes"] > 0  # lost mid-run, after some work
    assert [w["worker"] for w in summary["per_worker"]] == [w for w in range(3) if w != worker]
    store = RunStore(out / "polyrhythm.db")
    (row,) = store.runs()
    assert row["status"] == "completed"
    epochs = store.epochs(row["run_id"])
    assert len(epochs) == EPOCHS
    assert all(math.isfinite(e["val_accuracy"]) for e in epochs)  # every epoch validated
    return summary


def test_an_asp_run_goes_on_without_a_killed_worker_and_records_it(tmp_path, capsys):
    out = tmp_path / "runs"
    run = _kill_during_training(out, 2, "--strategy", "asp")  # worker 1
    summary = _completed_without(run, out, worker=1)
    assert summary["on_worker_failure"] == "continue"
    # The survivors trained on after the loss (at the first epoch's end, or just after).
    epochs = RunStore(out / "polyrhythm.db").epochs(summary["run_id"])
    assert summary["final_val_accuracy"] > epochs[0]["val_accuracy"] + 0.02
    text = write_report(out / "polyrhythm.db", [summary["run_id"]], tmp_path / "report",
                        "Lost", fmt="md").read_text()
    assert "## Lost workers" in text and f"| {summary['run_id']} | asp | 1 |" in text
    # `polyrhythm runs` shows the workers it started with and ended with.
    assert main(["runs", "--out", str(out)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if summary["run_id"] in x]
    assert " 3→2 " in line
    assert main(["runs", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers_at_end"] == 2


def test_worker_1_validates_the_epochs_and_bn_statistics_are_the_survivors_mean(tmp_path):
    """Worker 0, which validates the epochs, is lost; worker 1 kept them and stands in. Each
    surviving worker took every step of every epoch, so BatchNorm's batch count, the
    survivors' batch-weighted mean, is exactly epochs x steps (2/3 of it if the lost
    worker's share still counted)."""
    out = tmp_path / "runs"
    run = _kill_during_training(out, 1, "--model", "resnet20", "--steps-per-epoch", "8",
                                "--strategy", "asp")
    summary = _completed_without(run, out, worker=0)
    state = torch.load(f"{summary['run_dir']}/model.pt", weights_only=True)
    counts = {v.item() for k, v in state.items() if k.endswith("num_batches_tracked")}
    assert counts == {EPOCHS * 8}


def test_bsp_told_to_continue_goes_on_and_by_default_aborts(tmp_path):
    run = _kill_during_training(tmp_path / "a", 3, "--strategy", "bsp",
                                "--on-worker-failure", "continue")
    _completed_without(run, tmp_path / "a", worker=2)
    run = _kill_during_training(tmp_path / "b", 3, "--strategy", "bsp")
    _aborted(run, tmp_path / "b", 3, "worker 2")


def test_allreduce_told_to_continue_sums_on_without_a_killed_worker_but_not_worker_0(tmp_path):
    """Under allreduce the workers left sum on over themselves; worker 0 records the run,
    so its loss still fails it, naming it."""
    run = _kill_during_training(tmp_path / "a", 2, "--strategy", "allreduce",
                                "--on-worker-failure", "continue", servers=0)
    summary = _completed_without(run, tmp_path / "a", worker=2, servers=0)
    store = RunStore(tmp_path / "a" / "polyrhythm.db")
    epochs = store.epochs(summary["run_id"])
    assert summary["final_val_accuracy"] > epochs[0]["val_accuracy"] + 0.02
    # The change is an event in the store, and the summary's timeline.
    (lost,) = summary["lost_workers"]
    (event,) = store.series("membership", summary["run_id"])
    assert event == {"t": lost["at_s"], "worker": 2, "rank": 2, "host": None,
                     "cause": "lost", "workers": 2}
    assert summary["membership"] == [event]
    assert summary["sums_by"] == "ring"  # not Gloo's own all-reduce, which cannot regroup
    run = _kill_during_training(tmp_path / "b", 0, "--strategy", "allreduce",
                                "--on-worker-failure", "continue", servers=0)
    _aborted(run, tmp_path / "b", 0, "worker 0", servers=0)


@pytest.mark.parametrize(("strategy", "dies_after"), [
    ("bsp", 6), ("asp", 6), ("ssp", 6), ("allreduce", 6), ("localsgd", 6), ("dpsgd", 6),
    ("gossip", 6), ("tree-easgd", 6),
    ("switch", 6), ("switch", 14),  # before its switch (after epoch 1 of 2), and after
])
def test_every_strategy_that_goes_on_completes_without_a_killed_worker(tmp_path, strategy,
                                                                        dies_after):
    """Told to continue, each family's run loses worker 2 (SIGKILL, on cue) and completes
    on the other two: the loss recorded in the summary and as an event in the store, no
    process of the run left."""
    config = small_config(tmp_path, strategy=strategy, workers=3, dataset="digits",
                          on_worker_failure="continue", dies_after_steps=[0, 0, dies_after])
    summary = polyrhythm.train(config)
    (lost,) = summary["lost_workers"]
    assert lost["worker"] == 2 and [w["worker"] for w in summary["per_worker"]] == [0, 1]
    (event,) = RunStore(tmp_path / "runs" / "polyrhythm.db").series("membership",
                                                                    summary["run_id"])
    assert (event["worker"], event["cause"], event["workers"]) == (2, "lost", 2)
    assert all(w["steps"] == 20 for w in summary["per_worker"])
    assert rank_processes(os.getpid()) == {}


def test_a_loss_that_would_leave_fewer_than_min_workers_fails_the_run_saying_so(tmp_path):
    run = _kill_during_training(tmp_path, 3, "--strategy", "asp", "--min-workers", "3")
    _aborted(run, tmp_path, 3, "worker 2")
    assert "2 workers would be left, fewer than --min-workers 3" in run.stderr


def test_a_lost_server_aborts_and_says_how_to_resume(tmp_path):
    run = _kill_during_training(tmp_path, 0, "--strategy", "asp")
    _aborted(run, tmp_path, 0, "server 0")
    assert "--resume" in run.stderr


@pytest.mark.parametrize(("fields", "mode"), [
    ({"strategy": "asp"}, "continue"),
    ({"strategy": "ssp"}, "continue"),
    ({"strategy": "downpour"}, "continue"),
    ({"strategy": {"name": "kbsp", "quorum": 2}}, "continue"),  # 2 of 3 left still meet k
    ({"strategy": {"name": "kbsp", "quorum": 3}}, "abort"),  # k = N: a round needs all
    ({"strategy": "bsp"}, "abort"),
    ({"strategy": "allreduce"}, "abort"),
    ({"strategy": "switch"}, "abort"),
    ({"strategy": "asp", "workers": 1}, "abort"),  # nobody to go on
])
def test_the_default_goes_on_only_where_the_survivors_make_the_same_updates(fields, mode):
    config = load_config(**{"workers": 3, **fields})
    assert config.on_worker_failure == mode
    assert "on_worker_failure" not in config.to_dict()  # stored only where given


@pytest.mark.parametrize(("fields", "said"), [
    ({"strategy": "asp", "min_workers": 4}, "is more than the run's 3 workers"),
    ({"strategy": "bsp", "min_workers": 2}, "aborts on any loss"),  # bsp's default: abort
    ({"strategy": "asp", "dies_after_steps": [0, 7]}, "needs one value per worker"),
    ({"strategy": "asp", "dies_after_steps": [0, 0, -1]}, "at least 0"),
])
def test_min_workers_or_a_fault_on_cue_that_cannot_be_is_one_line(fields, said):
    with pytest.raises(ConfigError, match=said):
        load_config(workers=3, **fields)
    config = load_config(strategy="bsp", workers=3, on_worker_failure="continue", min_workers=2)
    assert config.min_workers == 2 and config.to_dict()["min_workers"] == 2
    assert "min_workers" not in load_config(strategy="asp", workers=3).to_dict()


def test_continue_is_refused_where_every_worker_waits_for_the_others():
    for strategy in ("mapreduce",):
        with pytest.raises(ConfigError, match="needs a strategy whose servers, or whose "
                                              "workers' sums and exchanges, go on without a "
                                              "lost worker"):
            load_config(strategy=strategy, on_worker_failure="continue")
    cli = subprocess.run([sys.executable, "-m", "polyrhythm.cli", "train", "--strategy",
                          "mapreduce", "--on-worker-failure", "continue"],
                         capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1


def test_a_collective_strategy_goes_on_when_told_and_sums_uncompressed():
    """continue is allowed under the collective strategies, local SGD and Strategy-Switch
    (abort stays their default); their compressed sums keep state per member: one line."""
    for strategy in ("allreduce", "ring", "tree", "reduce-broadcast", "localsgd", "dpsgd",
                     "gossip", "tree-easgd", "switch"):
        assert load_config(strategy=strategy, workers=3).on_worker_failure == "abort"
        config = load_config(strategy=strategy, workers=3, on_worker_failure="continue")
        assert config.on_worker_failure == "continue"
    with pytest.raises(ConfigError, match="under allreduce sums gradients uncompressed: drop "
                                          "--compress topk"):
        load_config(strategy="allreduce", workers=3, on_worker_failure="continue",
                    compress="topk")


def _killed_mid_event(sender) -> None:
    """A rank killed as it tells its launcher something: the first half of the bytes `send`
    writes for an event written, then SIGKILL."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    send(writer, {"rank": 0, "step": 1})
    whole = os.read(reader.fileno(), 4096)
    os.write(sender.fileno(), whole[:len(whole) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def _tells_and_leaves(sender, after) -> None:
    """A rank that, once `after` is set, sends an event and exits as the launcher's ranks do."""
    after.wait()
    send(sender, {"rank": 1, "step": 1})
    life.leave_now(0)


def test_a_rank_killed_mid_event_holds_up_neither_the_others_nor_the_launcher():
    """The cause of a rare hang of the tests above: the ranks sent their events (progress,
    failures) through one queue, whose writers take a lock in turn, and a worker killed while
    its queue's thread held it, writing progress, kept it for ever. The survivors trained to
    the end and then each waited at its exit, for ever, for its own events to be written:
    the run never ended. Each rank has a pipe of its own now. Rank 0 killed in the middle of
    an event holds up neither rank 1's event nor its exit, and the launcher reads rank 0's
    half message as the end of its pipe instead of waiting for the rest."""
    ctx = forkserver.context()  # as the launcher's ranks
    events = RankEvents(ctx, 2)
    first_killed = ctx.Event()
    procs = [ctx.Process(target=_killed_mid_event, args=(events.senders[0],)),
             ctx.Process(target=_tells_and_leaves, args=(events.senders[1], first_killed))]
    events.start(procs)
    procs[0].join(HANG_GUARD_S)
    first_killed.set()
    procs[1].join(HANG_GUARD_S)
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, 0]
    taken: list = []
    reader = threading.Thread(target=lambda: taken.extend(events.take() + events.take()),
                              daemon=True)
    reader.start()
    reader.join(HANG_GUARD_S)
    assert not reader.is_alive(), "the launcher waited for the rest of a dead rank's message"
    assert taken == [{"rank": 1, "step": 1}]
    events.close()
