"""The mapreduce strategy's arithmetic, without Spark (launch/launchers/mapreduce.py runs it
as Spark jobs): what a cached partition holds, the gradient of a partition's share of a mini-batch
(in an executor), and the driver's model, its optimizer step and the run's result.

A partition is a worker's shard of the run's data plan, and its share of each mini-batch is
the batch that worker would take at that step (`batch_slice` of its epoch order): so
`mapreduce` and `bsp` with as many workers as partitions take the same steps. Each share's
mean gradient is weighted by its share of the global batch, as bsp's workers weight theirs;
the driver sums them and steps the run's optimizer, as bsp's server does. A share as large as
its partition is the whole partition: full-batch gradient descent (MLlib's GD).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from polyrhythm.config import RunConfig
from polyrhythm.data.datasets import open_source
from polyrhythm.data.sharding import batch_slice, epoch_order
from polyrhythm.data.source import Dataset, Normalisation
from polyrhythm.errors import Diverged
from polyrhythm.flat import FlatParameters
from polyrhythm.losses import LOSSES
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.models.build import build_model
from polyrhythm.optim import lr_at, updater
from polyrhythm.runtime.summary import RunResult, combine
from polyrhythm.runtime.validation import evaluate
from polyrhythm.runtime.worker.builtin import batch_generator


@dataclass
class Partition:
    """A worker's shard, as an executor caches it: its stored samples and targets."""

    index: int
    x: np.ndarray
    y: np.ndarray
    classes: int
    norm: Normalisation
    augment: bool
    read_s: float = 0.0  # what reading it took its executor

    def dataset(self) -> Dataset:
        return Dataset(torch.from_numpy(self.x), torch.from_numpy(self.y), self.classes,
                       self.norm, self.augment)


def read_partition(config_values: dict, index: int, rows: np.ndarray,
                   labels: np.ndarray) -> Partition:
    """Partition `index`: source rows `rows` (with their targets `labels`, as the plan has
    them), read by the executor that caches it."""
    config = RunConfig(**config_values)
    source = open_source(config.data, config.seed)
    (x,) = source.rows(rows)
    return Partition(index, np.ascontiguousarray(x), labels, source.classes, source.norm,
                     source.augment)


def shares(batch_size: int, sizes: list[int]) -> list[int]:
    """Each partition's rows of a mini-batch of `batch_size`: the global batch split as bsp
    splits it over workers, a partition's whole shard where that is more (full batch)."""
    base, extra = divmod(batch_size, len(sizes))
    return [min(base + (1 if i < extra else 0), n) for i, n in enumerate(sizes)]


@dataclass(frozen=True)
class Step:
    """What one mini-batch job asks of every partition."""

    epoch: int
    step: int  # within the epoch
    taken: int  # steps before this one, in all
    shares: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.shares)


class ExecutorModel:
    """The model an executor's Python worker computes gradients with, built once (Spark
    reuses the worker across jobs) and loaded with each job's broadcast parameters."""

    _built: dict[str, ExecutorModel] = {}

    def __init__(self, config: RunConfig, shape: tuple[int, ...], classes: int) -> None:
        self.config = config
        self.model = build_model(config.model, shape, classes, config.seed, config.loss)
        self.flat = FlatParameters(self.model)
        self.loss = LOSSES[config.loss]

    @classmethod
    def of(cls, config_toml: str, config_values: dict, shape: tuple[int, ...],
           classes: int) -> ExecutorModel:
        if config_toml not in cls._built:
            torch.set_num_threads(1)  # an executor of one core
            cls._built = {config_toml: cls(RunConfig(**config_values), shape, classes)}
        return cls._built[config_toml]

    def gradient(self, partition: Partition, weights: np.ndarray,
                 step: Step) -> tuple[np.ndarray, float, float]:
        """(the partition's share of the step's gradient, weighted by its share of the global
        batch; its loss, weighted alike; the seconds its rows took to gather, as a bsp
        worker's read span counts its batch's)."""
        data, rows = partition.dataset(), step.shares[partition.index]
        if rows == 0:
            return np.zeros(len(self.flat), np.float32), 0.0, 0.0
        self.flat.data.copy_(torch.from_numpy(weights))
        seed = self.config.seed
        if rows >= len(data):
            idx = np.arange(len(data))
        else:
            order = epoch_order(np.arange(len(data)), step.epoch, seed, partition.index)
            idx = batch_slice(order, rows, step.step)
        augment = data.augment and batch_generator(seed, partition.index, step.taken)
        began = time.perf_counter()
        x, y = data.batch(torch.from_numpy(idx), augment or None)
        gathered = time.perf_counter() - began
        self.model.zero_grad(set_to_none=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        weight = rows / step.rows
        return (self.flat.grad() * weight).numpy(), loss.item() * weight, gathered


class DriverModel:
    """The model the driver holds and steps: the run's optimizer on its flat parameters."""

    def __init__(self, config: RunConfig, shape: tuple[int, ...], classes: int) -> None:
        self.config = config
        self.model = build_model(config.model, shape, classes, config.seed, config.loss)
        self.flat = FlatParameters(self.model)
        self.optimizer = updater(self.flat.data, config.optimizer)

    def weights(self) -> np.ndarray:
        return self.flat.data.numpy().copy()

    def step(self, gradient: np.ndarray, loss: float, epoch: int, step: int) -> None:
        if not math.isfinite(loss) or not np.isfinite(gradient).all():
            raise Diverged(f"diverged at epoch {epoch + 1}, step {step + 1}: non-finite loss "
                           "or gradient")
        self.optimizer.step(torch.from_numpy(gradient), lr_at(self.config.optimizer, epoch))

    def validate(self, val: Dataset) -> dict[str, float]:
        return evaluate(self.model, val, LOSSES[self.config.loss])


def run_result(config: RunConfig, driver: DriverModel, val: Dataset, partitions: list[dict],
               wall_s: float, figures: dict) -> RunResult:
    """The run's result, as a parameter-server run's is made: a report per partition (its
    epochs, its iterations' spans, the bytes it moved), the driver's model and its validation,
    and what mapreduce adds (`figures`)."""
    reports = [{"role": "worker", "rank": p["index"], "worker": p["index"],
                "epochs": p["epochs"], "steps": len(p["iterations"]),
                "batch_size": p["batch_size"], "spans": _totals(p["iterations"]),
                "traffic": p["traffic"], "iterations": p["iterations"],
                "strategy": {"mapreduce": figures}, "shapes": driver.flat.shapes}
               for p in partitions]
    final = driver.validate(val)
    return combine(config, reports, driver.model.state_dict(), final, len(driver.flat),
                   wall_s)


def _totals(iterations: list[tuple]) -> dict[str, float]:
    """Seconds per span over a partition's iterations (rows as the store's: worker, step,
    epoch, t, the spans in SPAN_NAMES order, total)."""
    return {name: sum(row[4 + i] for row in iterations) for i, name in enumerate(SPAN_NAMES)}
