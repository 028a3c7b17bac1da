"""One parameter-server bucket: parameters [start, stop) of the flat model, their optimizer
state, their consistency policy and, under compression, their codecs (compression/buckets.py:
a decoder of pushes, and with compressed replies a sender of each worker's replies)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from polyrhythm.comm.messages import REPLY_HEADER, RUN_SCHEDULE
from polyrhythm.compression.buckets import BucketCodecs
from polyrhythm.optim import Updater, lr_at, updater
from polyrhythm.strategies.consistency import ConsistencyPolicy

# A bucket's optimizer on its weights, elements [start, stop) of the flat model, for its
# policy's concurrency.
MakeUpdater = Callable[[torch.Tensor, int, int, float], Updater]


def run_updater(optimizer, weights: torch.Tensor, start: int, stop: int,
                concurrency: float) -> Updater:
    """The run's [optimizer] on a bucket (the same on every slice)."""
    return updater(weights, optimizer, concurrency)


class Bucket:
    """Parameters [start, stop) of the flat model, their optimizer state and their policy."""

    def __init__(self, initial: torch.Tensor, start: int, stop: int, policy: ConsistencyPolicy,
                 make_updater: MakeUpdater, codecs: BucketCodecs | None = None) -> None:
        self.start, self.stop = start, stop
        self.codecs = codecs
        # The reply is [version, over, weights ...]: the weights live inside it, so answering
        # a worker sends this buffer as it is, with no copy.
        self.outbox = torch.cat([torch.zeros(REPLY_HEADER), initial[start:stop]])
        self.weights = self.outbox[REPLY_HEADER:]
        # An elastic centre adds what it gets; every other policy steps the run's optimizer.
        self.optimizer = None if policy.elastic else make_updater(self.weights, start, stop,
                                                                  policy.concurrency)
        self.policy = policy
        # Where an update sums several pushes, they add up in float64 and are rounded to
        # float32 once: the sum then does not depend on the order the pushes arrive in, so a
        # synchronous run is the same whatever the timing (in float32, 3 workers' gradients
        # summed in another order moved a 20-step bsp run by 1.6e-5).
        wide = torch.float64 if policy.combines else torch.float32
        self.pending = torch.zeros_like(self.weights, dtype=wide)
        self.update = torch.empty_like(self.weights) if policy.combines else self.pending
        self.pending_weight = 0.0
        self.pending_share = 0.0  # the sum of weight x scale: global batches' worth of step
        self.alone: torch.Tensor | None = None  # a push that is the update by itself
        self.version = 0  # weight updates applied so far
        self.progress = 0.0  # global batches' worth of gradient applied (drives lr decay)
        self.lr = RUN_SCHEDULE  # the rate the last push carried (a script's scheduler)
        self.hyper: list[float] | None = None  # the settings it carried (a script's optimizer)
        # Compressed replies: each worker's [version, over, progress, encoded change].
        self.replies = None
        if codecs is not None and codecs.replies is not None:
            words = codecs.replies[0].codec.words
            self.replies = [torch.zeros(REPLY_HEADER + words) for _ in codecs.replies]

    @property
    def over(self) -> bool:
        """Training has ended on this bucket: every reply tells the worker to stop."""
        return bool(self.outbox[1])

    def end(self) -> None:
        self.outbox[1] = 1

    def reply(self, worker: int) -> torch.Tensor:
        """What answers `worker` now: the outbox as it is, or under compressed replies the
        outbox's header and the encoded change since the worker's copy."""
        if self.replies is None:
            return self.outbox
        box = self.replies[worker]
        box[:REPLY_HEADER] = self.outbox[:REPLY_HEADER]
        self.codecs.reply(worker, self.weights, box[REPLY_HEADER:])
        return box

    def accumulate(self, grad: torch.Tensor, weight: float, scale: float = 1.0,
                   lr: float = RUN_SCHEDULE, hyper: list[float] | None = None, *,
                   applied_next: bool = False) -> None:
        """Add a gradient with its batch weight; `scale` shrinks its step, not its weight;
        `lr`, the rate its worker's optimizer steps at now (RUN_SCHEDULE: the run's
        schedule's); `hyper`, every setting of its optimizer's groups now (a script's: the
        update steps at its last push's). `applied_next`: `apply` comes before `grad` is
        written again, so a push alone in its update with weight and scale 1 (a single
        worker's) is taken as the update itself: the pending sum would hold exactly its
        values, after three passes over them on the step's critical path (add, copy, zero)."""
        self.lr, self.hyper = lr, hyper
        if applied_next and weight == 1 and scale == 1 and not self.pending_weight \
                and not self.policy.elastic:
            self.alone = grad[:self.stop - self.start]
        else:
            self.pending.add_(grad[:self.stop - self.start], alpha=weight * scale)
        self.pending_weight += weight
        self.pending_share += weight * scale

    def apply(self, optimizer, steps_per_epoch: int) -> None:
        """Apply the pending update (`optimizer`: the run's optimizer settings)."""
        policy = self.policy
        before = self.weights.clone() if policy.tracks_change else None
        update, self.alone = self.alone, None
        if update is None:
            if policy.averages:  # the (batch-weighted) mean of the gradients received
                self.pending.div_(self.pending_weight)
            if self.update is not self.pending:
                self.update.copy_(self.pending)
            update = self.update
        if policy.elastic:
            self.weights.add_(update)
        else:
            # Small tolerance: weights like 1/3 do not sum to exact integers in floating point.
            epoch = math.floor(self.progress / steps_per_epoch + 1e-6)
            self._step(update, lr_at(optimizer, epoch) if self.lr < 0 else self.lr)
        if before is not None:
            policy.on_update(float((self.weights - before).abs().max()))
        if update is self.update:
            self.pending.zero_()
        self.progress += self.pending_weight
        self.pending_weight = self.pending_share = 0.0
        self.version += 1
        self.outbox[0], self.outbox[2] = self.version, self.progress

    def _step(self, update: torch.Tensor, lr: float) -> None:
        """Step the optimizer by the update. One whose step is not linear in the gradient
        (Adam: the gradient's scale cancels out) gets the mean gradient, and its learning
        rate is scaled by the share of a global batch the update is (an asynchronous push's
        batch share, a staleness-aware scale), as a linear one's step is by the gradient."""
        scale = 1.0
        if not self.optimizer.linear and self.pending_weight > 0:
            share = self.pending_share
            if self.policy.averages:
                share /= self.pending_weight
            if share > 0 and share != 1:
                update.div_(share)
                scale = share
        if self.hyper is not None:  # a script's optimizer, at the settings its push carried
            self.optimizer.follow(self.hyper, scale)
            self.optimizer.step(update, None)
        else:
            self.optimizer.step(update, lr * scale)

    def take_over(self, weights: torch.Tensor, optimizer: dict | None, steps: int) -> None:
        """Start from another layout's state (a Strategy-Switch's synchronous phase, or a
        checkpoint of another number of servers): its weights, its optimizer's flat state
        for this slice (optim.py; None: a fresh one) and its `steps`, each one update of a
        global batch, so versions and the learning-rate schedule carry on from there. An
        elastic centre has no optimizer to fill."""
        self.weights.copy_(weights)
        if self.codecs is not None:
            self.codecs.restart(self.weights)
        if self.optimizer is not None and optimizer is not None:
            self.optimizer.load_state_dict(optimizer)
        self.version, self.progress = steps, float(steps)
        self.outbox[0], self.outbox[2] = steps, steps

    def state_dict(self) -> dict:
        """Weights, optimizer state, version, progress, the pending update and the policy:
        everything the bucket holds."""
        return {"outbox": self.outbox.clone(), "pending": self.pending.clone(),
                "pending_weight": self.pending_weight, "pending_share": self.pending_share,
                "version": self.version,
                "progress": self.progress, "policy": self.policy.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                "codecs": self.codecs.state_dict() if self.codecs else None}

    def load_state_dict(self, state: dict) -> None:
        self.outbox.copy_(state["outbox"])  # the weights are a view into it
        self.pending.copy_(state["pending"])
        self.pending_weight, self.version = state["pending_weight"], state["version"]
        # A checkpoint from before the share was kept held SGD's state, which does not read it.
        self.pending_share = state.get("pending_share", self.pending_weight)
        self.progress = state["progress"]
        self.policy.load_state_dict(state["policy"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.codecs is not None:
            self.codecs.load_state_dict(state.get("codecs"))
