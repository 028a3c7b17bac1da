"""Checkpoints: every rank's state at epoch ends, so a failed or interrupted run can go on.

A checkpoint is a folder `<run>/checkpoints/epoch-NNNN/` (N: epochs completed) with one file
per rank: `worker-<i>.pt` (the worker's state_dict and its epoch records so far) and, while
servers hold the model, `server-<j>.pt` (its buckets, with their place in the flat model, so
a resume may use another number of servers). Worker
0 also writes `model.pt`, its model's plain `state_dict` with the optimizer's momentum in
`torch.optim.SGD`'s layout (its parameters named), loadable by plain PyTorch; where the
servers hold the model (a parameter server's run, a Strategy-Switch's second phase), the
rank that completes the checkpoint puts their weights and momentum in it. Each file is
written atomically (written, flushed to disk, renamed), so a crash while writing leaves the
previous one usable, and its SHA-256 after it (`<name>.sha256`: runtime/digests.py).
A checkpoint is complete when every file it needs and its digest are there (one an older
polyrhythm wrote, without digests: every file it needs); a resume trusts it only where every
file matches its digest (runtime/intact.py). While the run goes on, each rank removes its own
files of the checkpoints older than the last two complete ones (worker 0's include
`model.pt` and the servers' mark), and a folder goes with its last file; once no rank writes
any more, `tidy` leaves the last two complete checkpoints and nothing else.

`snapshots/` holds the model at the end of each epoch (worker 0's; every worker's where the
workers hold different models), written as the epoch ends by the worker that keeps it
(runtime/snapshots.py), each with its digest: the epochs are validated on them after
training, so a resumed run needs those of the epochs already done. They stay while the run
may be resumed and go when it completes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from polyrhythm.comm.messages import REPLY_HEADER
from polyrhythm.errors import DataError
from polyrhythm.files import atomic_file, open_regular
from polyrhythm.runtime import digests

FOLDER = "checkpoints"
SERVERS_EXPECTED = "servers-expected"  # worker 0's mark: this checkpoint needs server files
MODEL = "model.pt"  # worker 0's: the model and optimizer as plain PyTorch loads them
RESUMED_CONFIG = "resumed.toml"  # beside config.toml: the config a resumed launch runs with
SNAPSHOTS = "snapshots"
_EPOCH = re.compile(r"epoch-(\d{4,})$")


def epoch_dir(run_dir: Path, epochs_done: int) -> Path:
    return Path(run_dir) / FOLDER / f"epoch-{epochs_done:04d}"


def is_due(config, epochs_done: int) -> bool:
    """Whether a run writes a checkpoint after `epochs_done` epochs: every `checkpoint_every`
    epochs (0: never) and after the last."""
    every = config.checkpoint_every
    return bool(every) and (epochs_done % every == 0 or epochs_done == config.epochs)


def snapshot_file(run_dir: Path, worker: int, epoch: int) -> Path:
    """Worker `worker`'s model snapshot at the end of epoch `epoch`, validated after
    training: a file of its own, written as the epoch ends (not in every checkpoint, whose
    size would grow with the epochs)."""
    return Path(run_dir) / FOLDER / SNAPSHOTS / f"worker-{worker}-epoch-{epoch:04d}.pt"


def save(state: dict, path: Path) -> None:
    """Write `state` to `path` atomically, and its digest after it (runtime/digests.py): a
    reader sees the old file or the whole new one, and a resume trusts it only where its
    digest matches."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digesting: digests.Digesting | None = None

    def vouch_for_both() -> None:  # written again: while the rename is pending, either
        old = digests.kept(path)   # file's bytes are vouched for
        if old:
            digests.keep(path, [*old, digesting.hexdigest()])

    with atomic_file(path, before_rename=vouch_for_both) as f:
        digesting = digests.Digesting(f)
        torch.save(state, digesting)
    digests.keep(path, [digesting.hexdigest()])
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the renames themselves reach the disk
    finally:
        os.close(folder)


def mark_servers_expected(run_dir: Path, epochs_done: int) -> None:
    folder = epoch_dir(run_dir, epochs_done)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SERVERS_EXPECTED).touch()


def needed(names: set[str], workers: int, servers: int) -> set[str]:
    """The names a checkpoint folder holding `names` needs to be complete: every worker's
    file, every server's where worker 0 marked it so, and, where any file has a digest (a
    checkpoint written with digests: runtime/digests.py), worker 0's model.pt and every
    such file's digest. Worker 0 writes model.pt and its digest before its own file, so a
    folder of this version is never complete without a digest in it."""
    files = {f"worker-{i}.pt" for i in range(workers)}
    if SERVERS_EXPECTED in names:
        files |= {f"server-{j}.pt" for j in range(servers)}
    if any(name.endswith(digests.SUFFIX) for name in names):
        files |= {MODEL}
        files |= {name + digests.SUFFIX for name in files}
    return files


def is_complete(folder: Path, workers: int, servers: int) -> bool:
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError:  # not there, or removed meanwhile by a rank pruning it
        return False
    return needed(names, workers, servers) <= names


def complete_epochs(run_dir: Path, workers: int, servers: int) -> list[int]:
    """Epochs-completed counts of the complete checkpoints, oldest first."""
    return [e for e in epoch_folders(run_dir)
            if is_complete(epoch_dir(run_dir, e), workers, servers)]


def prune(run_dir: Path, own: list[str], workers: int, servers: int) -> None:
    """Remove this rank's files (`own`: its names in a checkpoint folder) of the checkpoints
    older than the second-newest complete one (with their digests), and each folder left
    empty. A rank removes only its own: a checkpoint that is not yet complete may still be
    completed by a rank that lags behind, and the last two complete ones are never touched,
    so whichever rank prunes first, the last two complete checkpoints stay whole."""
    complete = complete_epochs(run_dir, workers, servers)
    if len(complete) < 2:
        return
    for epochs_done in epoch_folders(run_dir):
        if epochs_done >= complete[-2]:
            continue
        folder = epoch_dir(run_dir, epochs_done)
        for name in own:
            (folder / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the folder gone: another rank emptied it
                # Its digest, its claim (model.pt's), a partial file a crash left.
                for kin in folder.glob(f"{name}.*"):
                    kin.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty yet: another rank's files are there
            folder.rmdir()


def tidy(run_dir: Path, workers: int, servers: int, completed: bool) -> None:
    """Once no rank writes any more (every rank is past training, or dead): remove every
    checkpoint folder but the last two complete ones (older ones some rank left, and newer
    incomplete ones, which cannot be resumed from: a run that went on without a lost worker
    writes only such), and, if the run `completed`, the snapshots, validated by now. With
    no complete checkpoint here (ranks on hosts without a shared disk) nothing is removed."""
    complete = complete_epochs(run_dir, workers, servers)
    if not complete:
        return
    for epochs_done in epoch_folders(run_dir):
        if epochs_done not in complete[-2:]:
            shutil.rmtree(epoch_dir(run_dir, epochs_done), ignore_errors=True)
    if completed:
        shutil.rmtree(Path(run_dir) / FOLDER / SNAPSHOTS, ignore_errors=True)


def epoch_folders(run_dir: Path) -> list[int]:
    """Epochs-completed counts of every checkpoint folder, complete or not."""
    root = Path(run_dir) / FOLDER
    return sorted(int(m.group(1)) for p in root.iterdir()
                  if (m := _EPOCH.match(p.name))) if root.is_dir() else []


def plain_sgd_state(flat, momentum: torch.Tensor | None, names: list[str]) -> dict:
    """A flat momentum buffer as torch.optim.SGD's state_dict (one entry per trained
    parameter, in model.parameters() order, each named as torch names them: `names`), so
    plain PyTorch can carry on from a checkpoint."""
    state = {}
    if momentum is not None:
        state = {i: {"momentum_buffer": momentum[a:b].view_as(p).clone()}
                 for i, (p, (a, b)) in enumerate(zip(flat.params, flat.ranges, strict=True))}
    return {"state": state, "param_groups": [{"params": list(range(len(flat.params))),
                                              "param_names": list(names)}]}


def complete_model(run_dir: Path, epochs_done: int, workers: int, servers: int) -> None:
    """Once the checkpoint after `epochs_done` epochs is complete, where its servers hold the
    model: its model.pt (worker 0's: the model's buffers, its parameters' names) takes the
    servers' weights and momentum, the model the checkpoint holds, whichever phase of a run
    wrote it. Every rank that finds it complete after writing its own file calls this; the
    first to claim the file writes it (two writing it at once could leave one's bytes with
    the other's digest: torch.save's bytes differ from one call to the next). Should that
    rank die on the way, model.pt is worker 0's still, or the servers' already, with its
    digest (`save`)."""
    folder = epoch_dir(run_dir, epochs_done)
    if not (folder / SERVERS_EXPECTED).exists() or not is_complete(folder, workers, servers):
        return
    try:  # O_EXCL: one winner, on a disk the ranks' hosts share too (NFS v3 and later)
        os.close(os.open(folder / f"{MODEL}.completing", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:  # claimed by another rank, or pruned meanwhile
        return
    try:
        model = load(folder / MODEL)
        files = [load(path) for path in folder.glob("server-*.pt")]
    except (OSError, DataError):  # pruned meanwhile: a newer checkpoint is complete
        return
    # Each server's buckets, in the order of their places in the flat model.
    buckets = [b for _, b in sorted((start, b) for f in files for (start, _), b in
                                    zip(f["ranges"], f["buckets"].values(), strict=True))]
    weights = torch.cat([b["outbox"][REPLY_HEADER:] for b in buckets])
    held = [b["optimizer"] or {} for b in buckets]
    momentum = (torch.cat([h["momentum_buffer"] for h in held])
                if all(isinstance(h.get("momentum_buffer"), torch.Tensor) for h in held) else None)
    group = model["optimizer"]["param_groups"][0]
    offset, state = 0, {}
    for i, name in enumerate(group["param_names"]):
        shape = model["model"][name].shape
        n = model["model"][name].numel()
        model["model"][name] = weights[offset:offset + n].view(shape).clone()
        if momentum is not None:
            state[i] = {"momentum_buffer": momentum[offset:offset + n].view(shape).clone()}
        offset += n
    save({"model": model["model"], "optimizer": {"state": state, "param_groups": [group]}},
         folder / MODEL)


def packed(rows: list[tuple]) -> torch.Tensor:
    """Event rows (an iteration's, a push's: numbers) as one float64 tensor, compact in a
    checkpoint however long the run (a list of tuples would pickle object by object)."""
    return torch.tensor(rows, dtype=torch.float64) if rows else torch.zeros(0)


def unpacked(table: torch.Tensor, ints: tuple[int, ...]) -> list[tuple]:
    """`packed`'s rows as they were: the fields at `ints` integers again (ranks, counts)."""
    return [tuple(int(v) if i in ints else v for i, v in enumerate(row))
            for row in table.tolist()]


def load(path: Path) -> dict:
    """A checkpoint file, loaded with weights_only: tensors and plain values only, nothing
    else is unpickled. Anything but a regular file (a named pipe would block) is a
    DataError."""
    with open_regular(path, "checkpoint file", DataError) as file:
        return torch.load(file, weights_only=True)


def resumed_config(config, run_dir: Path) -> Path:
    """The config file a resumed launch's ranks read: the run's own, as the resume changed it
    (other servers, epochs or checkpoints), beside the record's config.toml, which keeps what
    the run was started with."""
    path = Path(run_dir) / RESUMED_CONFIG
    path.write_text(config.to_toml())
    return path


@dataclass(frozen=True)
class Resume:
    """Where a resumed run's ranks read their states: a complete checkpoint folder, and the
    number of servers that wrote it (the flat model is re-sliced if it changed)."""

    folder: Path
    servers: int

    @classmethod
    def at(cls, folder: Path) -> Resume:
        """The checkpoint in `folder`, written by as many servers as left their files there
        (a resumed run may have changed their number since the run's config was stored)."""
        return cls(Path(folder), len(list(Path(folder).glob("server-*.pt"))))

    def load(self, name: str) -> dict:
        """One file of the checkpoint (see `load`)."""
        return load(self.folder / name)

    def server_states(self) -> list[dict]:
        return [self.load(f"server-{j}.pt") for j in range(self.servers)]

    @property
    def servers_expected(self) -> bool:
        return (self.folder / SERVERS_EXPECTED).exists()
