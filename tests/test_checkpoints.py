"""Checkpoint pruning: whatever order the ranks write and prune in (one lagging behind, one
lost), the last two complete checkpoints stay whole; once nobody writes, only they are left;
a real run of five epochs ends with its last two checkpoint folders and no snapshots. A
resume trusts only files that match their digests, and snapshots likewise; what it passes
over is set aside, never loaded later."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import polyrhythm
from helpers import flip_tensor_bytes
from polyrhythm.comm.messages import REPLY_HEADER
from polyrhythm.errors import DataError, StoreError
from polyrhythm.runtime import checkpoint, digests
from polyrhythm.runtime.checkpoint import (
    MODEL,
    SERVERS_EXPECTED,
    complete_epochs,
    epoch_dir,
    prune,
    snapshot_file,
    tidy,
)
from polyrhythm.runtime.intact import SET_ASIDE, latest

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


# -- which checkpoint a resume trusts (runtime/intact.py) ---------------------------------


def _saved(run: Path, epochs_done: int, ranks: list[str] = RANKS) -> None:
    """A checkpoint as the ranks write it (checkpoint.save: each file, then its digest):
    worker 0 first marks it a servers' one and writes model.pt."""
    folder = epoch_dir(run, epochs_done)
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        if rank == "worker-0":
            (folder / SERVERS_EXPECTED).touch()
            checkpoint.save({"model": {"w": torch.full((64,), float(epochs_done))}},
                            folder / MODEL)
        checkpoint.save({"state": torch.full((256,), float(epochs_done)), "rank": rank},
                        folder / f"{rank}.pt")


def _set_aside(run: Path) -> list[str]:
    root = run / checkpoint.FOLDER / SET_ASIDE
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_a_file_with_flipped_bytes_is_not_trusted_and_its_checkpoint_is_set_aside(tmp_path):
    """The newest server file's bytes flipped (it still loads, with other numbers): the
    resume takes the checkpoint before it, and the damaged one goes out of its way."""
    run = tmp_path / "run"
    for e in (1, 2):
        _saved(run, e)
    flip_tensor_bytes(epoch_dir(run, 2) / "server-0.pt")
    said = []
    resume, done = latest(run, WORKERS, SERVERS, say=said.append)
    assert (resume.folder, done) == (epoch_dir(run, 1), 1)
    assert resume.load("server-0.pt")["state"].eq(1.0).all()
    kept = run / checkpoint.FOLDER / SET_ASIDE / "epoch-0002-damaged"
    assert said == [f"checkpoint after epoch 2 is damaged (server-0.pt does not match its "
                    f"digest): set aside in {str(kept)!r}; trying the one before it"]
    assert _folders(run) == ["epoch-0001", SET_ASIDE]
    assert {p.name for p in kept.iterdir()} == {SERVERS_EXPECTED} | {
        name + digest for name in (MODEL, *(f"{rank}.pt" for rank in RANKS))
        for digest in ("", ".sha256")}
    for e in (1, 2):  # a digest is sha256sum's line: `sha256sum -c` checks a file by hand
        _saved(tmp_path / "again", e)
    check = subprocess.run(["sha256sum", "-c", "worker-1.pt.sha256"], capture_output=True,
                           text=True, cwd=epoch_dir(tmp_path / "again", 2))
    assert check.returncode == 0 and check.stdout == "worker-1.pt: OK\n", check


def test_a_skipped_checkpoints_files_are_not_loaded_after_the_epoch_is_redone(tmp_path):
    """After a resume from epoch 1 passed over a damaged epoch 2 (a truncated file), the
    redone epoch 2's workers write their files and its server dies before writing its own:
    epoch 2 must not count as complete with the failed run's server file, nor be resumed
    from."""
    run = tmp_path / "run"
    for e in (1, 2):
        _saved(run, e)
    path = epoch_dir(run, 2) / "worker-1.pt"
    path.write_bytes(path.read_bytes()[:100])
    assert latest(run, WORKERS, SERVERS, say=lambda line: None)[1] == 1
    _saved(run, 2, ["worker-0", "worker-1"])  # the server died before its file
    assert complete_epochs(run, WORKERS, SERVERS) == [1]
    said = []
    assert latest(run, WORKERS, SERVERS, say=said.append)[1] == 1
    assert said[0].startswith("checkpoint after epoch 2 is incomplete (no server-0.pt): set "
                              "aside in ")
    assert _set_aside(run) == ["epoch-0002-damaged", "epoch-0002-incomplete"]


def test_a_damaged_snapshot_is_found_before_training_and_the_resume_falls_back(tmp_path):
    """Epoch 3's model snapshot damaged: the checkpoint after 3 epochs needs it (the run
    validates epoch 3 on it after training), so the resume takes the one after 2, which
    redoes epoch 3 and writes it again. With epoch 1's damaged, no checkpoint is left."""
    run = tmp_path / "run"
    for e in (2, 3):
        _saved(run, e)
    for e in range(3):
        checkpoint.save({"snapshot": torch.full((64,), float(e))}, snapshot_file(run, 0, e))
    flip_tensor_bytes(snapshot_file(run, 0, 2))
    said = []
    resume, done = latest(run, WORKERS, SERVERS, say=said.append)
    assert done == 2
    assert said[0].startswith("epoch 3's model snapshot is damaged (worker-0-epoch-0002.pt "
                              "does not match its digest): set aside in ")
    assert said[1].startswith("checkpoint after epoch 3 needs epoch 3's model snapshot, which "
                              "is damaged: set aside in ")
    assert _set_aside(run) == ["epoch-0003-snapshot-damaged",
                               "snapshots-worker-0-epoch-0002-damaged"]
    assert not snapshot_file(run, 0, 2).exists() and snapshot_file(run, 0, 1).exists()
    flip_tensor_bytes(snapshot_file(run, 0, 0))
    with pytest.raises(DataError, match="no usable checkpoint in .*: the run cannot be resumed"):
        latest(run, WORKERS, SERVERS, say=said.append)


def test_a_file_whose_digest_never_came_makes_its_checkpoint_incomplete(tmp_path):
    """A rank died between its file's rename and its digest's: the file is whole, but
    nothing vouches for it. model.pt, rewritten with the servers' model by one rank only
    (the first to claim it), keeps the digest of its bytes."""
    run = tmp_path / "run"
    _saved(run, 1)
    (epoch_dir(run, 1) / "worker-1.pt.sha256").unlink()
    assert complete_epochs(run, WORKERS, SERVERS) == []
    _saved(run, 1, ["worker-1"])
    assert complete_epochs(run, WORKERS, SERVERS) == [1]
    folder = epoch_dir(run, 1)
    model = {"model": {"w": torch.zeros(4)}, "optimizer": {
        "state": {}, "param_groups": [{"params": [0], "param_names": ["w"]}]}}
    checkpoint.save(model, folder / MODEL)
    server = {"ranges": [(0, 4)], "buckets": {0: {
        "outbox": torch.cat([torch.zeros(REPLY_HEADER), torch.arange(4.0)]),
        "optimizer": {"momentum_buffer": torch.ones(4)}}}}
    checkpoint.save(server, folder / "server-0.pt")
    checkpoint.complete_model(run, 1, WORKERS, SERVERS)
    assert checkpoint.load(folder / MODEL)["model"]["w"].equal(torch.arange(4.0))
    checkpoint.save(model, folder / MODEL)  # as if the first rank's were undone
    checkpoint.complete_model(run, 1, WORKERS, SERVERS)  # a second rank: claimed already
    assert checkpoint.load(folder / MODEL)["model"]["w"].equal(torch.zeros(4))
    assert latest(run, WORKERS, SERVERS)[1] == 1  # every file matches its digest


def test_a_file_written_again_is_vouched_for_at_every_moment(tmp_path, monkeypatch):
    """model.pt completed with the servers' model (a snapshot redone likewise): before and
    after each of its digest's writes, the file matches its digest and the checkpoint stays
    complete, so a rank dying at any moment leaves neither untrusted (and pruning, which
    counts on the last two complete checkpoints staying so, keeps them)."""
    run = tmp_path / "run"
    _saved(run, 1)
    path = epoch_dir(run, 1) / MODEL
    moments = []

    def watched(target: Path, hexdigests: list[str]) -> None:
        for _ in range(2):  # before the write, after it
            moments.append((len(digests.kept(target)), digests.problem(target),
                            complete_epochs(run, WORKERS, SERVERS)))
            if len(moments) % 2:
                keep(target, hexdigests)

    keep = digests.keep
    monkeypatch.setattr(digests, "keep", watched)
    checkpoint.save({"model": {"w": torch.zeros(64)}}, path)
    assert moments == [(1, None, [1]), (2, None, [1]), (2, None, [1]), (1, None, [1])]
    assert checkpoint.load(path)["model"]["w"].eq(0).all()


def test_a_checkpoint_written_before_digests_is_trusted_if_it_loads(tmp_path):
    """An older polyrhythm's checkpoints have no digests: complete when their files are
    there, usable when each loads, as they were; one that does not load is set aside."""
    run = tmp_path / "run"
    for e in (1, 2):
        folder = epoch_dir(run, e)
        folder.mkdir(parents=True)
        for rank in RANKS:
            torch.save({"state": torch.full((8,), float(e))}, folder / f"{rank}.pt")
    assert latest(run, WORKERS, 0, say=lambda line: None)[1] == 2
    path = epoch_dir(run, 2) / "worker-0.pt"
    path.write_bytes(path.read_bytes()[:100])
    said = []
    assert latest(run, WORKERS, 0, say=said.append)[1] == 1
    assert said[0].startswith("checkpoint after epoch 2 is unreadable (worker-0.pt: ")
    assert _set_aside(run) == ["epoch-0002-damaged"]


def test_a_checkpoint_that_cannot_be_set_aside_stops_the_resume_in_one_line(tmp_path,
                                                                            monkeypatch):
    """Left in place, a passed-over folder would be loaded by a later resume: where it
    cannot be moved, the resume stops, saying so."""
    run = tmp_path / "run"
    for e in (1, 2):
        _saved(run, e)
    flip_tensor_bytes(epoch_dir(run, 2) / "worker-0.pt")

    def refused(source, target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(StoreError, match=r"^cannot set aside '.*epoch-0002' \(Permission "
                                         r"denied\): it would be loaded by a later resume; "
                                         r"move it away by hand$"):
        latest(run, WORKERS, SERVERS, say=lambda line: None)
