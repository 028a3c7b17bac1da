"""Checkpoint pruning: whatever order the ranks write and prune in (one lagging behind, one
lost), the last two complete checkpoints stay whole; once nobody writes, only they are left;
a real run of five epochs ends with its last two checkpoint folders and no snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import polyrhythm
from polyrhythm.comm.messages import REPLY_HEADER
from polyrhythm.runtime import checkpoint
from polyrhythm.runtime.checkpoint import (
    MODEL,
    SERVERS_EXPECTED,
    complete_epochs,
    epoch_dir,
    prune,
    snapshot_file,
    tidy,
)

WORKERS, SERVERS, EPOCHS = 2, 1, 6
RANKS = ["server-0", "worker-0", "worker-1"]


def _own(rank: str) -> list[str]:
    """A rank's file names in a checkpoint folder, as the runtime prunes them."""
    return [f"{rank}.pt", *([MODEL, SERVERS_EXPECTED] if rank == "worker-0" else [])]


def _write(run: Path, rank: str, epochs_done: int) -> None:
    """What a rank writes at a checkpoint (worker 0: the mark and the model first), then
    its pruning, as worker.py and server.py do."""
    folder = epoch_dir(run, epochs_done)
    folder.mkdir(parents=True, exist_ok=True)
    for name in reversed(_own(rank)):  # the rank's own state file last
        (folder / name).write_bytes(b"state")
    prune(run, _own(rank), WORKERS, SERVERS)


def _folders(run: Path) -> list[str]:
    return sorted(p.name for p in (run / checkpoint.FOLDER).iterdir() if p.name != "snapshots")


def _play(run: Path, schedule: list[tuple[str, int]]) -> list[int]:
    """Each (rank, epochs) write in turn; after every one, the newest two checkpoints ever
    complete must still be complete. The epochs ever complete."""
    ever: list[int] = []
    for rank, epochs_done in schedule:
        _write(run, rank, epochs_done)
        now = complete_epochs(run, WORKERS, SERVERS)
        ever = sorted(set(ever) | set(now))
        assert now[-2:] == ever[-2:], (rank, epochs_done, now, ever)
    return ever


def _in_step(order: list[str]) -> list[tuple[str, int]]:
    return [(rank, e) for e in range(1, EPOCHS + 1) for rank in order]


def _one_lagging() -> list[tuple[str, int]]:
    """worker-1 writes each checkpoint two epochs after the others (an asynchronous
    strategy's slow worker), then catches up at the end."""
    fast = [(rank, e) for e in range(1, EPOCHS + 1) for rank in ("server-0", "worker-0")]
    slow = [("worker-1", e) for e in range(1, EPOCHS + 1)]
    out = []
    for i, step in enumerate(fast):
        out.append(step)
        if i % 2 == 1 and i // 2 >= 2:
            out.append(slow.pop(0))
    return out + slow


@pytest.mark.parametrize(("schedule", "left"), [
    # In step, each rank prunes what is older than the second-newest complete checkpoint as
    # it writes: the disk holds three checkpoints at most, whatever the epochs.
    pytest.param(_in_step(RANKS), 3, id="in-step"),
    pytest.param(_in_step(list(reversed(RANKS))), 3, id="in-step-reversed"),
    pytest.param(_one_lagging(), None, id="one-lagging")])
def test_the_last_two_complete_checkpoints_stay_whole_and_only_they_are_left(
        tmp_path, schedule, left):
    run = tmp_path / "run"
    ever = _play(run, schedule)
    assert ever[-2:] == [EPOCHS - 1, EPOCHS]
    if left is not None:
        assert _folders(run) == [f"epoch-{e:04d}" for e in range(EPOCHS - left + 1,
                                                                   EPOCHS + 1)]
    snapshot_file(run, 0, 0).parent.mkdir(parents=True)
    snapshot_file(run, 0, 0).write_bytes(b"model")
    tidy(run, WORKERS, SERVERS, completed=True)  # nobody writes any more
    assert _folders(run) == [f"epoch-{EPOCHS - 1:04d}", f"epoch-{EPOCHS:04d}"]
    assert not snapshot_file(run, 0, 0).parent.exists()
    for e in (EPOCHS - 1, EPOCHS):
        assert sorted(p.name for p in epoch_dir(run, e).iterdir()) == sorted(
            name for rank in RANKS for name in _own(rank))


def test_a_lost_worker_leaves_the_checkpoints_before_the_loss_whole(tmp_path):
    """worker-1 is lost after 2 epochs; the others go on (on_worker_failure = continue) and
    write checkpoints that can never be complete: the two before the loss stay whole, and a
    failed run's tidy keeps them (to resume from) and drops the incomplete ones."""
    run = tmp_path / "run"
    schedule = [(r, e) for e in range(1, EPOCHS + 1) for r in RANKS
                if r != "worker-1" or e <= 2]
    assert _play(run, schedule) == [1, 2]
    assert complete_epochs(run, WORKERS, SERVERS) == [1, 2]
    snapshot_file(run, 0, 0).parent.mkdir(parents=True)
    snapshot_file(run, 0, 0).write_bytes(b"model")
    tidy(run, WORKERS, SERVERS, completed=False)
    assert _folders(run) == ["epoch-0001", "epoch-0002"]
    assert snapshot_file(run, 0, 0).exists()  # a resumed run validates its epochs on them


def test_tidy_removes_nothing_where_no_checkpoint_is_complete(tmp_path):
    """Ranks on hosts without a shared disk each see only their own files."""
    run = tmp_path / "run"
    for e in (1, 2, 3):
        _write(run, "worker-0", e)
    tidy(run, WORKERS, SERVERS, completed=True)
    assert _folders(run) == ["epoch-0001", "epoch-0002", "epoch-0003"]


def test_a_run_of_five_epochs_ends_with_its_last_two_checkpoints(tmp_path):
    summary = polyrhythm.train({"strategy": "bsp", "workers": 2, "epochs": 5,
                                "dataset": "digits", "steps_per_epoch": 3,
                                "checkpoint_every": 1, "out": str(tmp_path / "runs")})
    run = Path(summary["run_dir"])
    assert sorted(p.name for p in (run / checkpoint.FOLDER).iterdir()) == [
        "epoch-0004", "epoch-0005"]
    assert complete_epochs(run, 2, 1) == [4, 5]
    assert (epoch_dir(run, 5) / MODEL).is_file()


@pytest.mark.parametrize(("fields", "servers_hold"), [
    ({"strategy": "switch", "to": "asp", "at": 0.5, "servers": 1}, True),  # ends on servers
    ({"strategy": "switch", "at": 1.0}, False),  # never switched: ends on the workers
    ({"strategy": "bsp", "servers": 1}, True),
], ids=["switched", "never-switched", "bsp"])
def test_model_pt_carries_the_momentum_of_the_phase_the_run_ended_in(tmp_path, fields,
                                                                    servers_hold):
    """The last checkpoint's model.pt is the model and momentum the checkpoint holds: the
    servers' where they hold the model (a switch run's asynchronous phase), the workers'
    where they step it; and plain torch.optim.SGD loads it by the parameters' names."""
    summary = polyrhythm.train({"workers": 2, "epochs": 4, "dataset": "digits",
                                "steps_per_epoch": 5, "out": str(tmp_path / "runs"),
                                **fields})
    folder = epoch_dir(Path(summary["run_dir"]), 4)
    saved = checkpoint.load(folder / MODEL)
    if servers_hold:
        server = checkpoint.load(folder / "server-0.pt")
        buckets = [server["buckets"][k] for k in sorted(server["buckets"])]
        weights = torch.cat([b["outbox"][REPLY_HEADER:] for b in buckets])
        momentum = torch.cat([b["optimizer"]["momentum_buffer"] for b in buckets])
    else:
        worker = checkpoint.load(folder / "worker-0.pt")["worker"]
        momentum = worker["strategy"]["first"]["optimizer"]["momentum_buffer"]
        weights = torch.cat([worker["model"][name].reshape(-1) for name in
                             saved["optimizer"]["param_groups"][0]["param_names"]])
    model = torch.nn.Sequential()  # any module: the names and shapes come from the file
    names = saved["optimizer"]["param_groups"][0]["param_names"]
    for i, name in enumerate(names):
        model.register_parameter(f"p{i}", torch.nn.Parameter(saved["model"][name].clone()))
    assert torch.equal(torch.cat([p.reshape(-1) for p in model.parameters()]), weights)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sgd.load_state_dict(saved["optimizer"])
    assert len(sgd.state) == len(names)
    assert torch.equal(torch.cat([sgd.state[p]["momentum_buffer"].reshape(-1)
                                  for p in model.parameters()]), momentum)
    assert momentum.abs().max() > 0
