"""How training examples are split across workers, and the order each worker reads them in.

Everything is a pure function of (seed, epoch, worker), so every process, and a single-process
reference in the tests, can rebuild any worker's batches without talking to anyone.
"""

from __future__ import annotations

import numpy as np


def random_shards(n_examples: int, workers: int, seed: int) -> list[np.ndarray]:
    """Balanced random sharding: a seeded permutation dealt round-robin (sizes differ by <= 1)."""
    perm = np.random.default_rng([seed, 0x5A4D]).permutation(n_examples)
    return [perm[i::workers] for i in range(workers)]


def worker_batch_sizes(global_batch: int, workers: int) -> list[int]:
    """Split the global batch B into per-worker batches B/N, the remainder to the first workers."""
    base, extra = divmod(global_batch, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def steps_per_epoch(n_examples: int, global_batch: int, cap: int | None = None) -> int:
    """Steps every worker takes per epoch: one pass of the global batch over the data."""
    steps = max(1, n_examples // global_batch)
    return min(steps, cap) if cap else steps


def epoch_order(shard: np.ndarray, epoch: int, seed: int, worker: int) -> np.ndarray:
    """The worker's shard, reshuffled for this epoch."""
    return shard[np.random.default_rng([seed, epoch, worker]).permutation(len(shard))]


def batch_slice(order: np.ndarray, batch: int, step: int) -> np.ndarray:
    """Indices of batch number `step` in an epoch order, wrapping if the shard runs out."""
    start = step * batch
    return order[np.arange(start, start + batch) % len(order)]


class DataPosition:
    """Where a worker is in its data: the epoch, the step within it and the steps taken in
    all. Its batches are a pure function of (seed, epoch, worker, step), so this is all a
    worker needs to carry on from where it was."""

    def __init__(self) -> None:
        self.epoch = self.step = self.taken = 0

    def advance(self) -> None:
        self.step += 1
        self.taken += 1

    def next_epoch(self) -> None:
        self.epoch += 1
        self.step = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step, self.taken = state["epoch"], state["step"], state["taken"]
