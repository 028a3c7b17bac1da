"""The training loop every worker runs: batch -> forward/backward -> strategy.step."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from polyrhythm.comm.transport import WORKERS
from polyrhythm.config.emulation import compute_times
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import RankContext
from polyrhythm.data.sharding import DataPosition, batch_slice, epoch_order, worker_batch_sizes
from polyrhythm.data.source import Dataset
from polyrhythm.errors import Diverged
from polyrhythm.flat import FlatParameters, RunningStatistics
from polyrhythm.losses import LOSSES, Loss
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.models.build import build_model
from polyrhythm.runtime import checkpoint
from polyrhythm.runtime.compute import emulated_step
from polyrhythm.runtime.snapshots import EpochSnapshots
from polyrhythm.runtime.validation import evaluate, validation_record, validation_sums
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.base import EpochEnd

PROGRESS_INTERVAL_S = 0.25


def batch_generator(seed: int, worker: int, step: int) -> torch.Generator:
    """The random source of one batch's augmentation: the same for the same step anywhere."""
    state = np.random.SeedSequence([seed, worker, step]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, criterion: Loss) -> float:
    """Forward and backward on one batch with the run's loss; leaves the gradients in the
    model."""
    model.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    return loss.item()


def worker_report(ctx: RankContext, epochs: list[dict], steps: int, iterations: list[tuple],
                  strategy) -> dict:
    """What every worker reports, whatever loop it ran (runtime/summary.py reads it): its
    epochs' records, steps taken, spans, traffic, iterations and its strategy's figures."""
    return {"role": "worker", "rank": ctx.rank, "worker": ctx.worker_index, "epochs": epochs,
            "steps": steps, "spans": dict(ctx.spans.totals),
            "traffic": ctx.transport.counters.snapshot(), "iterations": iterations,
            "strategy": strategy.summary()}


class Worker:
    """One data-parallel worker: its shard, its batches, its model replica and its strategy."""

    def __init__(self, ctx: RankContext, train: Dataset, val: Dataset, steps: int) -> None:
        """`train` is this worker's shard; `steps` its steps per epoch (the run's)."""
        c, i = ctx.config, ctx.worker_index
        self.ctx, self.train, self.val = ctx, train, val
        self.criterion = LOSSES[c.loss]
        self.model = build_model(c.model, train.shape, train.classes, c.seed, c.loss)
        self.flat = FlatParameters(self.model)
        self.statistics = RunningStatistics(self.model)
        self.batch = worker_batch_sizes(c.batch_size, c.workers)[i]
        self.share = self.batch / c.batch_size  # of the global batch: its weight in means
        self.shard = np.arange(len(train))  # positions in the shard held
        self.steps = steps
        self.delay = c.worker_delay_s[i] if i < len(c.worker_delay_s) else 0.0
        self.slowdown = c.slowdown[i] if i < len(c.slowdown) else 1.0
        self.emulated = compute_times(c, i)  # None: real forward and backward
        self.strategy = STRATEGIES[c.strategy.name].build_worker(
            ctx, self.flat, self.batch / c.batch_size, c.strategy)
        self.position = DataPosition()
        self._last_progress = 0.0
        # The model validated at each epoch end: the first worker's, or where workers hold
        # different models, their consensus (each snapshot pre-multiplied by its weight).
        # Kept on disk, read back one at a time (runtime/snapshots.py).
        self.consensus = self.strategy.consensus_weight() is not None
        self.snapshots = self._snapshot_store() if self._keeps_snapshots else None
        self.snapshot_weights: list[float] = []
        # Each epoch end's running statistics, weighted by this worker's batch share.
        self.statistics_snapshots: list[torch.Tensor] = []
        self.epochs: list[dict] = []  # the records of the epochs done
        # Per iteration: (worker, step, epoch, t, compute, push, wait, pull, apply, total).
        self.iterations: list[tuple] = []

    def state_dict(self) -> dict:
        """The model (parameters and buffers), the strategy's worker side, the data position
        and the random state: what this worker needs to carry on. Copies, as every piece's
        state is: training on does not change a state taken."""
        model = {k: v.clone() for k, v in self.model.state_dict().items()}
        return {"model": model, "strategy": self.strategy.state_dict(),
                "position": self.position.state_dict(), "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.strategy.load_state_dict(state["strategy"])
        self.position.load_state_dict(state["position"])
        torch.set_rng_state(state["rng"])

    def run(self) -> None:
        """Train for the configured epochs (those a checkpoint holds are done), then leave
        (`report` follows, once the survivors are known)."""
        self.strategy.start()
        shared = self.ctx.config.shared_epochs  # epochs are the servers' count, not ours
        for epoch in range(len(self.epochs), self.ctx.config.epochs):
            self.epochs.append(self.train_epoch(epoch))
            if not shared:
                self.position.next_epoch()
            self._checkpoint(epoch + 1)
        self.strategy.finish()  # decentralised strategies may agree on a final model here

    def report(self, lost: set[int]) -> dict:
        """This worker's report, once every survivor knows which workers were lost (`lost`,
        their indices: runtime/survivors.py). The first worker left validates the epochs'
        snapshots, if it kept them, with the running statistics of the workers left."""
        final = self.flat.data.clone()
        statistics = self._agree_on_statistics(lost)
        first = min(set(range(self.ctx.config.workers)) - lost)
        me = self.ctx.worker_index
        try:
            self._validate_snapshots(statistics, validates=me == first)
        finally:
            if self.snapshots is not None:
                self.snapshots.close()
        report = worker_report(self.ctx, self.epochs, self.position.taken, self.iterations,
                               self.strategy)
        if me == first and not self.ctx.topology.servers:  # no server holds the model
            report["shard"] = (0, len(self.flat), final)
        if me == first and statistics:
            report["statistics"] = statistics[-1]  # the final model's
        return report

    def train_epoch(self, epoch: int) -> dict:
        """Train one epoch, let the strategy end it (end_epoch) and return its record."""
        ctx, config = self.ctx, self.ctx.config
        order, ordered = None, None  # the data epoch's batch order, and that data epoch
        t0, loss_sum, taken = time.perf_counter(), 0.0, 0
        waited = 0.0  # seconds blocked on peers or servers this epoch
        measured_from = None  # when this epoch's first step after the warm-up began
        position = self.position
        while not self._epoch_done(epoch):
            if self.strategy.stopped:
                break  # the servers ended the run (k-BSP: its rounds are done)
            if position.step >= self.steps:  # shared epochs: through this shard once more
                position.next_epoch()
            if ordered != position.epoch:
                ordered = position.epoch
                order = epoch_order(self.shard, ordered, config.seed, ctx.worker_index)
            step = position.step
            began = time.perf_counter()
            if measured_from is None and position.taken >= config.warmup_steps:
                measured_from = began
            with ctx.spans("compute"):
                idx = torch.from_numpy(batch_slice(order, self.batch, step))
                self.strategy.begin_step(epoch)
                if self.delay:
                    time.sleep(self.delay)  # emulated slower compute
                computing = time.perf_counter()
                if self.emulated is not None:
                    loss = emulated_step(self.model, self.emulated())
                else:
                    augment = self.train.augment and batch_generator(
                        config.seed, ctx.worker_index, position.taken)
                    loss = train_step(self.model, *self.train.batch(idx, augment or None),
                                      self.criterion)
                    if not math.isfinite(loss):  # before its gradient reaches anyone
                        raise Diverged(f"diverged at epoch {epoch + 1}, step {step + 1}: "
                                       f"training loss {loss}")
                if self.slowdown > 1:  # a slower node: this step's compute, stretched
                    time.sleep((self.slowdown - 1) * (time.perf_counter() - computing))
            self.strategy.step(epoch)
            ended = time.perf_counter()
            spans = ctx.spans.take()
            waited += spans.get("wait", 0.0)
            if config.instrumentation:
                self.iterations.append((
                    ctx.worker_index, position.taken, epoch, began - ctx.started,
                    *(spans.get(name, 0.0) for name in SPAN_NAMES), ended - began))
            position.advance()
            taken += 1
            loss_sum += loss
            self._progress(epoch, step + 1, loss, taken * self.batch / (ended - t0))
        ended = time.perf_counter()
        if not torch.isfinite(self.flat.data).all():
            raise Diverged(f"diverged at epoch {epoch + 1}, step {position.step}: "
                           "non-finite parameters")
        record = {"epoch": epoch, "train_loss": loss_sum / taken if taken else math.nan,
                  "samples": taken * self.batch, "seconds": ended - t0,
                  "wall_s": ended - ctx.started}
        # Throughput leaves out the warm-up steps (first iterations pay for lazy set-up).
        if measured_from is not None:
            measured_steps = min(taken, position.taken - config.warmup_steps)
            record["measured_samples"] = measured_steps * self.batch
            record["measured_seconds"] = ended - measured_from
        else:
            record["measured_samples"], record["measured_seconds"] = 0, 0.0
        # Validated after training, unless the strategy needs it now (its rule): evaluating
        # would stall the other workers, and their waiting would count as communication.
        record |= self.strategy.end_epoch(EpochEnd(epoch + 1, waited, ended - t0,
                                                   self._validate))
        if self.consensus:
            weight = self.strategy.consensus_weight()
            self.snapshots.put(epoch, self.flat.data * weight)
            self.snapshot_weights.append(weight)
        elif self.snapshots is not None:
            self.snapshots.put(epoch, self.flat.data)  # written at once: no copy kept
        if self.statistics:
            self.statistics_snapshots.append(self.statistics.get() * self.share)
        return record

    def _epoch_done(self, epoch: int) -> bool:
        """This worker's steps of the epoch are taken; with shared epochs, the servers have
        applied the epoch's global batches, whoever computed them."""
        if not self.ctx.config.shared_epochs:
            return self.position.step >= self.steps
        progress = self.strategy.progress
        # Tolerance: batch shares like 1/3 add up to a hair under a whole batch.
        return progress is not None and progress >= (epoch + 1) * self.steps - 1e-3

    def _validate(self) -> dict[str, float]:
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

    def _validate_snapshots(self, statistics: list[torch.Tensor], validates: bool) -> None:
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
        for e, record in enumerate(self.epochs):
            snapshot = self.snapshots.get(e)
            if weights is not None:
                self.ctx.transport.all_reduce(snapshot, WORKERS)
                snapshot.div_(weights[e].float())
            if validates and "val_loss" not in record:  # not validated during the run
                self.flat.data.copy_(snapshot)
                with self._statistics(statistics[e] if statistics else None):
                    record.update(evaluate(self.model, self.val, self.criterion))
            del snapshot  # before the next is read

    def checkpoint_state(self) -> dict:
        """This worker's part of a checkpoint: its state, and what its report needs of the
        epochs done (their records and weights; the model snapshots validated after training
        are files of their own, written as each epoch ends: see _snapshot_store)."""
        return {"worker": self.state_dict(), "epochs": self.epochs,
                "snapshot_weights": self.snapshot_weights,
                "statistics_snapshots": self.statistics_snapshots}

    def resume(self, resume) -> None:
        """Carry on from a checkpoint (runtime/checkpoint.py Resume)."""
        state = resume.load(f"worker-{self.ctx.worker_index}.pt")
        self.load_state_dict(state["worker"])
        self.epochs = list(state["epochs"])
        self.snapshot_weights = list(state["snapshot_weights"])
        self.statistics_snapshots = list(state["statistics_snapshots"])
        if self.snapshots is not None:  # read when validated, not now
            owner = self.ctx.worker_index if self.consensus else 0  # see _snapshot_store
            self.snapshots.adopt([checkpoint.snapshot_file(self.ctx.run_dir, owner, e)
                                  for e in range(len(self.epochs))])

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

    def _checkpoint(self, epochs_done: int) -> None:
        """This worker's files of the checkpoint after `epochs_done` epochs, if one is due
        (the snapshots of the epochs it holds are written already, as each ended)."""
        ctx, config = self.ctx, self.ctx.config
        if ctx.run_dir is None or not checkpoint.is_due(config, epochs_done):
            return
        i = ctx.worker_index
        if i == 0:
            if self.strategy.servers_hold_model:
                checkpoint.mark_servers_expected(ctx.run_dir, epochs_done)
            model = self.model.state_dict()
            momentum = getattr(getattr(self.strategy, "optimizer", None), "buffer", None)
            optimizer = checkpoint.plain_sgd_state(self.flat, momentum)
            checkpoint.save({"model": model, "optimizer": optimizer},
                            checkpoint.epoch_dir(ctx.run_dir, epochs_done) / checkpoint.MODEL)
        own = [f"worker-{i}.pt"] + ([checkpoint.MODEL, checkpoint.SERVERS_EXPECTED] if i == 0
                                    else [])
        checkpoint.save(self.checkpoint_state(),
                        checkpoint.epoch_dir(ctx.run_dir, epochs_done) / own[0])
        checkpoint.prune(ctx.run_dir, own, config.workers, config.servers)

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

    def _progress(self, epoch: int, step: int, loss: float, samples_per_s: float) -> None:
        now = time.perf_counter()
        if step < self.steps and now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        self.ctx.progress({"rank": self.ctx.rank, "worker": self.ctx.worker_index,
                           "epoch": epoch + 1, "epochs": self.ctx.config.epochs, "step": step,
                           "steps": self.steps, "loss": loss, "samples_per_s": samples_per_s})
