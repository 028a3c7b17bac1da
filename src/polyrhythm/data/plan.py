"""A run's data plan: which rows train and which validate, and each worker's shard.

The plan is computed once per run, by one process, and handed to the others (runtime/job.py
sends it over the process group); each worker then reads only its own shard and the
validation rows from the source (`load_part`), and a server reads nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from dataclasses import dataclass

import numpy as np
import torch

from polyrhythm.data.source import Dataset, Source, normalise
from polyrhythm.data.splitters import ToSplit, shard_stats, split
from polyrhythm.errors import ConfigError
from polyrhythm.losses import LOSSES


@dataclass(frozen=True)
class DataPlan:
    """`train` and `val` are source rows, with their labels; `shards[w]` indexes `train`
    (worker w's examples, copies allowed). `stats` describe the shards
    (splitters.shard_stats)."""

    shape: tuple[int, ...]
    classes: int
    train: np.ndarray
    train_labels: np.ndarray
    val: np.ndarray
    val_labels: np.ndarray
    shards: list[np.ndarray]
    sharding: str
    stats: list[dict]
    split_s: float

    def summary(self) -> dict:
        """What a run stores of its plan."""
        return {"sharding": self.sharding, "train_examples": len(self.train),
                "val_examples": len(self.val), "split_s": self.split_s, "shards": self.stats}


def hold_out(size: int, given_val: int, val_fraction: float, seed: int,
             what: str = "the data set") -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows): the source's own validation part if it has one, else
    a seeded random share (the same seed gives the same split on every process)."""
    n_val = validation_rows(size, given_val, val_fraction, what)
    if given_val:
        return np.arange(size - given_val), np.arange(size - given_val, size)
    perm = np.random.default_rng([seed, 0x5EED]).permutation(size)
    return perm[n_val:], perm[:n_val]


def validation_rows(size: int, given_val: int, val_fraction: float,
                    what: str = "the data set") -> int:
    """Rows held out of `size`: the source's own validation part, or the share (at least
    one); a ConfigError naming `what` where that leaves no row to train on."""
    n_val = given_val or max(1, round(size * val_fraction))
    if n_val >= size:
        held = (f"its validation part is all {size:,} of them" if given_val else
                f"val_fraction {val_fraction:g} holds out {n_val:,} of them")
        raise ConfigError(f"{what} has {size:,} example{'s' * (size != 1)} and {held}, "
                          "leaving none to train on")
    return n_val


def check_split(size: int, given_val: int, settings, batch_size: int) -> None:
    """Before a run is recorded: its validation share leaves rows to train on, and one
    global batch fits in them (a larger one would take each row more than once a step)."""
    train = size - validation_rows(size, given_val, settings.val_fraction,
                                   f"dataset {settings.name}")
    if batch_size > train:
        raise ConfigError(f"batch_size {batch_size:,} is more than the {train:,} training "
                          f"examples of dataset {settings.name}: lower --batch-size")


def make_plan(source: Source, settings, workers: int, seed: int,
              loss: str = "cross_entropy") -> DataPlan:
    """Hold out the validation rows and split the training rows across `workers`; the
    labels are the targets the run's `loss` takes (losses.py), checked."""
    task = LOSSES[loss]
    labels = task.targets(source.labels(), source.classes, f"dataset {settings.name}")
    train, val = hold_out(len(labels), source.given_val, settings.val_fraction, seed,
                          f"dataset {settings.name}")
    # Real-valued targets have no classes: to the splitters and the shard statistics, one.
    classes, strata = ((source.classes, labels) if task.classifies
                       else (1, np.zeros(len(labels), np.int64)))

    def features() -> np.ndarray:
        (x,) = source.rows(train)
        return normalise(torch.from_numpy(x).float(), source.norm).reshape(len(x), -1).numpy()

    began = time.perf_counter()
    shards = split(ToSplit(strata[train], classes, features), workers, seed, settings)
    split_s = time.perf_counter() - began
    return DataPlan(tuple(source.shape), source.classes, train, labels[train], val,
                    labels[val], shards, settings.sharding or "random",
                    shard_stats(shards, strata[train], classes), split_s)


def load_part(source: Source, plan: DataPlan, worker: int | None) -> tuple[Dataset, Dataset]:
    """(worker's shard, validation set), read in one pass; `worker` None: the whole
    training set (a single-process reference)."""
    mine = slice(None) if worker is None else plan.shards[worker]
    x, x_val = source.rows(plan.train[mine], plan.val)
    give_back_freed_memory()
    return (Dataset.of(source, x, plan.train_labels[mine]),
            Dataset.of(source, x_val, plan.val_labels))


def give_back_freed_memory() -> None:
    """Return the heap pages freed after reading to the system. Reading a member allocates
    and frees tens of MB; glibc serves such blocks from its heap once one was freed (its
    mmap threshold rises) and keeps the freed pages, so a worker would hold the size of the
    whole data set long after reading it (measured: 464 MB against 279 MB)."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)


def load_val(source: Source, plan: DataPlan) -> Dataset:
    (x,) = source.rows(plan.val)
    return Dataset.of(source, x, plan.val_labels)
