"""The built-in job's validation of its epochs: shared out among the workers when a strategy's
rule needs the figures at once, else after training from each epoch's snapshot (validating
during training would stall the other workers, and their waiting would count as
communication). Where the workers hold different models, the model validated is their
consensus; a model's running statistics (BatchNorm) are the workers' batch-weighted mean.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from polyrhythm.comm.transport import WORKERS
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import RankContext
from polyrhythm.data.sharding import worker_batch_sizes
from polyrhythm.data.source import Dataset
from polyrhythm.flat import FlatParameters, RunningStatistics
from polyrhythm.losses import Loss
from polyrhythm.runtime import checkpoint
from polyrhythm.runtime.snapshots import EpochSnapshots
from polyrhythm.runtime.validation import evaluate, validation_record, validation_sums


class EpochValidation:
    """One worker's part in validating the epochs of the model it trains under `strategy`;
    `share`: its batch's share of the global batch (its weight in the statistics' mean)."""

    def __init__(self, ctx: RankContext, model: nn.Module, flat: FlatParameters, val: Dataset,
                 criterion: Loss, strategy, share: float) -> None:
        self.ctx, self.model, self.flat, self.val = ctx, model, flat, val
        self.criterion, self.strategy, self.share = criterion, strategy, share
        self.statistics = RunningStatistics(model)
        # The model validated at each epoch end: the first worker's, or where workers hold
        # different models, their consensus (each snapshot pre-multiplied by its weight).
        # Kept on disk, read back one at a time (runtime/snapshots.py).
        self.consensus = strategy.consensus_weight() is not None
        self.snapshots = self._snapshot_store() if self._keeps_snapshots else None
        self.snapshot_weights: list[float] = []
        # Each epoch end's running statistics, weighted by this worker's batch share.
        self.statistics_snapshots: list[torch.Tensor] = []

    def now(self) -> dict[str, float]:
        """Validate the model now, shared out: each worker evaluates its slice of the
        validation set and the workers add their sums through one exact all-reduce, so every
        worker holds the same figures. The time goes to span "validate", not to
        communication: every worker validates, none waits for another's validation."""
        with self.ctx.spans("validate"):
            n, i, size = self.ctx.config.workers, self.ctx.worker_index, len(self.val)
            part = slice(i * size // n, (i + 1) * size // n)
            mean = None
            if self.statistics:
                mean = self.statistics.get() * self.share
                self.ctx.transport.all_reduce(mean, WORKERS)
            with self._statistics(mean):
                sums = validation_sums(self.model, self.val, self.criterion, part)
            rows = self.ctx.transport.rows_of_members(torch.tensor(sums, dtype=torch.float64))
        return validation_record(rows.sum(0).tolist(), size, self.criterion)

    def keep(self, epoch: int) -> None:
        """Keep the model of the epoch that ended, to validate after training."""
        if self.consensus:
            weight = self.strategy.consensus_weight()
            self.snapshots.put(epoch, self.flat.data * weight)
            self.snapshot_weights.append(weight)
        elif self.snapshots is not None:
            self.snapshots.put(epoch, self.flat.data)  # written at once: no copy kept
        if self.statistics:
            self.statistics_snapshots.append(self.statistics.get() * self.share)

    def after_training(self, records: list[dict], lost: set[int],
                       validates: bool) -> torch.Tensor | None:
        """Validate the epochs not validated during the run (filling in their `records`)
        on the worker that `validates` (the first left), with the running statistics of the
        workers left (`lost`: those lost); the final model's statistics, if it has any."""
        statistics = self._agree_on_statistics(lost)
        try:
            self._validate_snapshots(records, statistics, validates)
        finally:
            if self.snapshots is not None:
                self.snapshots.close()
        return statistics[-1] if statistics else None

    def _validate_snapshots(self, records: list[dict], statistics: list[torch.Tensor],
                            validates: bool) -> None:
        """Validate the epochs not validated during the run, one epoch's snapshot in memory
        at a time, on the worker that `validates` (the first left), if it kept them.

        Where the workers hold different models, each epoch's snapshot first becomes the
        weighted mean of every worker's: one all-reduce among the workers per epoch (every
        epoch's, validated or not, so all workers make the same calls). With two workers
        that is bit for bit the all-reduce of all epochs stacked it replaces (a + b = b + a);
        with more, Gloo's ring adds an element's terms in an order set by its place in the
        buffer, so an epoch's mean may differ in its last bits from the stacked one's, which
        depended on the number of epochs. Dividing by the summed weights also covers
        weights that do not sum to 1 at an epoch end (gossip weight in flight); the weights,
        a number an epoch, are all-reduced at once as before."""
        weights = None
        if self.consensus:
            weights = torch.tensor(self.snapshot_weights, dtype=torch.float64)
            self.ctx.transport.all_reduce(weights, WORKERS)
        elif not (validates and self.snapshots is not None):
            return
        for e, record in enumerate(records):
            snapshot = self.snapshots.get(e)
            if weights is not None:
                self.ctx.transport.all_reduce(snapshot, WORKERS)
                snapshot.div_(weights[e].float())
            if validates and "val_loss" not in record:  # not validated during the run
                self.flat.data.copy_(snapshot)
                with self._statistics(statistics[e] if statistics else None):
                    record.update(evaluate(self.model, self.val, self.criterion))
            del snapshot  # before the next is read

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it (the snapshots themselves are files of their own,
        written as each epoch ends: see _snapshot_store)."""
        return {"snapshot_weights": list(self.snapshot_weights),
                "statistics_snapshots": list(self.statistics_snapshots)}

    def load_state_dict(self, state: dict, epochs: int) -> None:
        """Carry on from a checkpoint after `epochs` epochs."""
        self.snapshot_weights = list(state["snapshot_weights"])
        self.statistics_snapshots = list(state["statistics_snapshots"])
        if self.snapshots is not None and self.ctx.run_dir is not None:  # read when validated
            owner = self.ctx.worker_index if self.consensus else 0  # see _snapshot_store
            self.snapshots.adopt([checkpoint.snapshot_file(self.ctx.run_dir, owner, e)
                                  for e in range(epochs)])

    @property
    def _keeps_snapshots(self) -> bool:
        """Whether this worker keeps each epoch's model for validation after training: every
        worker where they hold different models, else worker 0; with on_worker_failure =
        continue, worker 1 too, to stand in should worker 0 be lost."""
        standby = 1 if self.ctx.config.on_worker_failure == CONTINUE else 0
        return self.consensus or self.ctx.worker_index <= standby

    def _snapshot_store(self) -> EpochSnapshots:
        """Where this worker keeps its epochs' snapshots. Where the run writes checkpoints,
        the checkpoint's snapshot files, written as each epoch ends: every worker's where
        the workers hold different models, else worker 0's alone (a standby spills its own,
        and reads worker 0's files for the epochs a checkpoint it resumes from holds). Any
        other worker's, and all in a run without checkpoints, spill (runtime/snapshots.py)."""
        ctx, i = self.ctx, self.ctx.worker_index
        if ctx.run_dir is not None and ctx.config.checkpoint_every and (self.consensus
                                                                         or i == 0):
            return EpochSnapshots(lambda e: checkpoint.snapshot_file(ctx.run_dir, i, e))
        return EpochSnapshots(spill_dir=ctx.run_dir)

    def _agree_on_statistics(self, lost: set[int]) -> list[torch.Tensor]:
        """Each epoch end's running statistics as the batch-weighted mean of the workers
        left (one all-reduce among them, after training); none for a model without any."""
        if not self.statistics:
            return []
        stacked = torch.stack(self.statistics_snapshots)
        self.ctx.transport.all_reduce(stacked, WORKERS)
        if lost:  # the survivors' shares no longer add up to 1
            c = self.ctx.config
            sizes = worker_batch_sizes(c.batch_size, c.workers)
            stacked /= sum(b for w, b in enumerate(sizes) if w not in lost) / c.batch_size
        return list(stacked)

    @contextmanager
    def _statistics(self, values: torch.Tensor | None) -> Iterator[None]:
        """The model with these running statistics for a while; its own again after."""
        if values is None:
            yield
            return
        own = self.statistics.get()
        self.statistics.set(values)
        try:
            yield
        finally:
            self.statistics.set(own)
