"""Each epoch end's model, kept for validation after training: on disk, not in memory.

A worker that validates the epochs after training (runtime/worker/epoch_validation.py) needs
every epoch end's model then. Held in memory they would grow with the epochs (ResNet-50 for
90 epochs: about 9 GB a worker), so each goes to disk as its epoch ends and comes back one
at a time: a worker holds at most the one being written or read, whatever the number of
epochs.

Where the worker writes the checkpoint's snapshot files (checkpoint.snapshot_file: worker
0's, or every worker's where the workers hold different models), those files are the
store: written atomically as the epoch ends, with their digests, they are there for a
resumed run until `checkpoint.tidy` removes them. Any other worker's (a standby's, or in a
run without checkpoints or without a run folder) go to a spill: one anonymous file
(unlinked from the start), in the run folder if there is one (a /tmp on tmpfs would hold
them in memory again), else in the system's temporary folder. The system frees it when the
worker closes it or its process ends, however it ends, so nothing is ever left behind.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from polyrhythm.errors import DataError
from polyrhythm.runtime import checkpoint


class EpochSnapshots:
    """Epoch e's snapshot (a flat model) is a file of its own or a slot of the spill."""

    def __init__(self, files: Callable[[int], Path] | None = None,
                 spill_dir: Path | None = None) -> None:
        """`files`: epoch -> the checkpoint file this worker writes it to (None: it spills,
        in `spill_dir`, or the system's temporary folder where that is None)."""
        self._files, self._spill_dir = files, spill_dir
        self._spill: BinaryIO | None = None  # opened at the first snapshot it takes
        self._slot_shape: tuple[torch.Size, torch.dtype] | None = None
        self._where: list[Path | int] = []  # per epoch: its file, or its slot in the spill

    def __len__(self) -> int:
        return len(self._where)

    def put(self, epoch: int, snapshot: torch.Tensor) -> None:
        """Keep `snapshot` as epoch `epoch`'s (the next one: epochs come in order). Written
        at once: the caller may drop or change the tensor on return."""
        if epoch != len(self._where):
            raise RuntimeError(f"snapshot of epoch {epoch} after {len(self._where)} epochs")
        if self._files is not None:
            path = self._files(epoch)
            checkpoint.save({"snapshot": snapshot}, path)
            self._where.append(path)
        else:
            self._where.append(self._write_slot(snapshot))

    def get(self, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s snapshot, read back: a tensor of its own, the same bits."""
        where = self._where[epoch]
        if isinstance(where, Path):
            return checkpoint.load(where)["snapshot"]
        return self._read_slot(where)

    def adopt(self, files: list[Path]) -> None:
        """A resumed run's epochs done: epoch e's snapshot is `files[e]`, read only when
        validated. Each must be there now: a run failing after training, for a file that
        was gone before it began, would waste the training (the resume's choice of
        checkpoint checked their bytes against their digests: runtime/intact.py)."""
        for epoch, path in enumerate(files):
            if not path.is_file():
                raise DataError(f"the checkpoint lacks epoch {epoch + 1}'s model snapshot "
                                f"({str(path)!r}): the run cannot be resumed")
        self._where = list(files)

    def close(self) -> None:
        """Give the spill back (the checkpoint's files stay for `checkpoint.tidy`)."""
        if self._spill is not None:
            self._spill.close()

    def _write_slot(self, snapshot: torch.Tensor) -> int:
        """Append `snapshot`'s bytes to the spill: its slot number. Slots are all of one
        shape (a flat model), so slot k starts at k times its size."""
        if self._spill is None:
            # A run folder not on this host's disk (torchrun on nodes without a shared one)
            # is not made here for the spill: the system's temporary folder takes it.
            here = self._spill_dir is not None and Path(self._spill_dir).is_dir()
            self._spill = tempfile.TemporaryFile(  # noqa: SIM115 (open until close())
                dir=self._spill_dir if here else None)
            self._slot_shape = (snapshot.shape, snapshot.dtype)
        if (snapshot.shape, snapshot.dtype) != self._slot_shape:
            raise RuntimeError(f"snapshot {tuple(snapshot.shape)} {snapshot.dtype} in a spill "
                               f"of {self._slot_shape}")
        slot = sum(isinstance(w, int) for w in self._where)
        self._spill.seek(slot * snapshot.nbytes)
        # The tensor's own memory as a buffer: no copy of the model on the way out.
        self._spill.write(memoryview(snapshot.detach().contiguous().numpy()).cast("B"))
        return slot

    def _read_slot(self, slot: int) -> torch.Tensor:
        shape, dtype = self._slot_shape
        snapshot = torch.empty(shape, dtype=dtype)
        self._spill.seek(slot * snapshot.nbytes)
        read = self._spill.readinto(memoryview(snapshot.numpy()).cast("B"))
        if read != snapshot.nbytes:
            raise RuntimeError(f"spilled snapshot {slot}: {read} of {snapshot.nbytes} bytes")
        return snapshot
