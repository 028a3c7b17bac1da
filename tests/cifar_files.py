"""CIFAR archives in the real on-disk format, built for tests: the python-pickle batches
(protocol 2, as the published files), in their folder and as a .tar.gz."""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np

LAYOUT = {  # folder, training members, test member
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch"),
    "cifar100": ("cifar-100-python", ["train"], "test"),
}


def _member(rng, rows: int, kind: str, name: str) -> dict:
    data = rng.integers(0, 256, (rows, 3 * 32 * 32), dtype=np.uint8)
    member = {b"batch_label": name.encode(), b"data": data,
              b"filenames": [f"{name}_{i}.png".encode() for i in range(rows)]}
    if kind == "cifar10":
        member[b"labels"] = (np.arange(rows) % 10).tolist()
    else:
        fine = rng.integers(0, 100, rows)
        member[b"fine_labels"], member[b"coarse_labels"] = fine.tolist(), (fine // 5).tolist()
    return member


def write_cifar(root: Path, kind: str = "cifar10", train_rows: int = 40, test_rows: int = 10,
                archive: bool = True) -> tuple[Path, Path | None]:
    """(folder, archive or None) of a CIFAR-10 or -100 data set with `train_rows` training
    images (split over the training members) and `test_rows` test images."""
    name, train, test = LAYOUT[kind]
    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, member in enumerate(train):
        rows = train_rows // len(train) + (i < train_rows % len(train))
        (folder / member).write_bytes(pickle.dumps(_member(rng, rows, kind, member), protocol=2))
    (folder / test).write_bytes(pickle.dumps(_member(rng, test_rows, kind, test), protocol=2))
    if not archive:
        return folder, None
    path = root / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname=folder.name)
    return folder, path
