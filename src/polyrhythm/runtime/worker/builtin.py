"""polyrhythm train's job, written as a script on the same Job a user's script gets
(runtime/worker/script.py): the registry's model, the run's loss and optimizer, this worker's shard
in the order its seed sets, real or emulated compute, the epochs validated as the strategy
needs. One worker loop for both: whatever the Job does for a script (records, spans,
checkpoints, the report) it does here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np
import torch

from polyrhythm.config.emulation import compute_times
from polyrhythm.context import RankContext
from polyrhythm.data.sharding import DataPosition, batch_slice, epoch_order, worker_batch_sizes
from polyrhythm.data.source import Dataset
from polyrhythm.losses import LOSSES
from polyrhythm.models.build import build_model
from polyrhythm.runtime.worker.compute import emulated_step
from polyrhythm.runtime.worker.epoch_validation import EpochValidation
from polyrhythm.runtime.worker.script import Job


def batch_generator(seed: int, worker: int, step: int) -> torch.Generator:
    """The random source of one batch's augmentation: the same for the same step anywhere."""
    state = np.random.SeedSequence([seed, worker, step]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


class BuiltinWorker:
    """One worker of polyrhythm train's job: its shard, its batches, its model replica, on a
    Job. `train` is its shard; `steps` the run's steps per epoch."""

    def __init__(self, ctx: RankContext, train: Dataset, val: Dataset, steps: int) -> None:
        c, i = ctx.config, ctx.worker_index
        self.ctx, self.train, self.val, self.steps = ctx, train, val, steps
        self.criterion = LOSSES[c.loss]
        self.batch = worker_batch_sizes(c.batch_size, c.workers)[i]
        share = self.batch / c.batch_size  # of the global batch: its weight in means
        self.emulated = compute_times(c, i)  # None: real forward and backward
        self.position = DataPosition()
        self.read_s = 0.0  # opening the data and reading this shard took (the life's clock)
        self.job = job = Job(ctx)
        self.model = build_model(c.model, train.shape, train.classes, c.seed, c.loss)
        job.wrap(self.model, batch_share=share)
        job.keep("position", self.position)
        job.steps_per_epoch, job.batch_size = steps, self.batch
        job.validation = EpochValidation(ctx, self.model, job.flat, val, self.criterion,
                                         job.strategy, share)

    def run(self) -> None:
        """Train for the configured epochs (those a checkpoint holds are done), then leave
        (`report` follows, once the survivors are known)."""
        self.job.start()
        for _ in self.job.epochs(self.ctx.config.epochs):
            self._train_epoch()
        self.job.finish()

    def train_epoch(self, epoch: int) -> dict:
        """Train epoch `epoch` alone (the job's records and checkpoints as in run); its
        record."""
        self.job.start()
        self.job.begin_epoch(epoch)
        self._train_epoch()
        self.job.end_epoch()
        return self.job.epochs_done[-1]

    def _train_epoch(self) -> None:
        job, model = self.job, self.model
        for batch in self.batches():
            job.begin_step()  # before the forward: pushes overlap backward
            if self.emulated is not None:
                emulated_step(model, self.emulated())
                job.step(loss=None)
                continue
            with self.ctx.spans("read"):  # the batch's rows gathered from the shard
                x, y = batch()
            model.zero_grad(set_to_none=True)
            loss = self.criterion(model(x), y)
            loss.backward()
            job.step(loss=loss.item())

    def batches(self) -> Iterator[Callable[[], tuple[torch.Tensor, torch.Tensor]] | None]:
        """This epoch's batches of the shard, each a call that reads it (None with emulated
        compute), in the order the run's seed sets for this worker: its steps, or with
        shared epochs as many as the servers need to have applied the epoch's global
        batches, whoever computed them (through the shard once more where it runs out)."""
        job, config, position = self.job, self.ctx.config, self.position
        shared, epoch = config.shared_epochs, job.epoch
        ordered = order = None
        while not self._epoch_done(epoch):
            if job.stopped:
                break  # the servers ended the run (k-BSP: its rounds are done)
            if position.step >= self.steps:  # shared epochs: through this shard once more
                position.next_epoch()
            if ordered != position.epoch:
                ordered = position.epoch
                order = epoch_order(np.arange(len(self.train)), ordered, config.seed,
                                    self.ctx.worker_index)
            if self.emulated is not None:
                yield None
            else:
                idx = torch.from_numpy(batch_slice(order, self.batch, position.step))
                augment = self.train.augment and batch_generator(
                    config.seed, self.ctx.worker_index, position.taken)
                yield functools.partial(self.train.batch, idx, augment or None)
            position.advance()
        if not shared:
            position.next_epoch()

    def _epoch_done(self, epoch: int) -> bool:
        """This worker's steps of the epoch are taken; with shared epochs, the servers have
        applied the epoch's global batches, whoever computed them."""
        if not self.ctx.config.shared_epochs:
            return self.position.step >= self.steps
        progress = self.job.strategy.progress
        # Tolerance: batch shares like 1/3 add up to a hair under a whole batch.
        return progress is not None and progress >= (epoch + 1) * self.steps - 1e-3

    def report(self, lost: set[int]) -> dict:
        return self.job.report(lost) | {"read_s": self.read_s, "shard_rows": len(self.train)}

    def state_dict(self) -> dict:
        return self.job.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.job.load_state_dict(state)

    def resume(self, resume) -> None:
        self.job.resume(resume)

    @property
    def resumed_s(self) -> float:
        return self.job.resumed_s

    @property
    def strategy(self):
        return self.job.strategy

    @property
    def flat(self):
        return self.job.flat

