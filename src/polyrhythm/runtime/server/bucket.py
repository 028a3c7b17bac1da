"""One parameter-server bucket: parameters [start, stop) of the flat model, their consistency
policy, their server update (its arithmetic and state, the optimizer's among it:
strategies/server_updates/) and, under compression, their codecs (compression/buckets.py: a
decoder of pushes, and with compressed replies a sender of each worker's replies)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from polyrhythm.comm.messages import REPLY_HEADER
from polyrhythm.compression.buckets import BucketCodecs
from polyrhythm.optim import Updater, lr_at, updater
from polyrhythm.strategies.consistency import ConsistencyPolicy
from polyrhythm.strategies.server_updates.base import ServerUpdate

# A bucket's optimizer on its weights, elements [start, stop) of the flat model, for its
# policy's concurrency.
MakeUpdater = Callable[[torch.Tensor, int, int, float], Updater]
# A bucket's server update on its weights: a ServerUpdate class with the strategy's settings
# and the worker count bound (runtime/job.py server_shard).
MakeServerUpdate = Callable[..., ServerUpdate]


def run_updater(optimizer, weights: torch.Tensor, start: int, stop: int,
                concurrency: float) -> Updater:
    """The run's [optimizer] on a bucket (the same on every slice)."""
    return updater(weights, optimizer, concurrency)


class Bucket:
    """Parameters [start, stop) of the flat model, their policy (when pushes become an
    update) and their server update (what an update does: strategies/server_updates/)."""

    def __init__(self, initial: torch.Tensor, start: int, stop: int, policy: ConsistencyPolicy,
                 make_update: MakeServerUpdate, make_updater: MakeUpdater,
                 codecs: BucketCodecs | None = None) -> None:
        self.start, self.stop = start, stop
        self.codecs = codecs
        # The reply is [version, over, weights ...]: the weights live inside it, so answering
        # a worker sends this buffer as it is, with no copy.
        self.outbox = torch.cat([torch.zeros(REPLY_HEADER), initial[start:stop]])
        self.weights = self.outbox[REPLY_HEADER:]
        self.policy = policy
        self.server_update = make_update(
            self.weights, combines=policy.combines,
            make_optimizer=lambda: make_updater(self.weights, start, stop, policy.concurrency))
        self.pending_weight = 0.0
        self.pending_share = 0.0  # the sum of weight x scale: global batches' worth of step
        self.version = 0  # weight updates applied so far
        self.progress = 0.0  # global batches' worth of gradient applied (drives lr decay)
        # The settings the last push carried (a script's optimizer's, its scheduler's rates
        # among them); None: the run's [optimizer] schedule.
        self.hyper: list[float] | None = None
        # Compressed replies: each worker's [version, over, progress, encoded change].
        self.replies = None
        if codecs is not None and codecs.replies is not None:
            words = codecs.replies[0].codec.words
            self.replies = [torch.zeros(REPLY_HEADER + words) for _ in codecs.replies]

    @property
    def optimizer(self) -> Updater | None:
        """The optimizer the server update steps (None: it moves the weights itself)."""
        return self.server_update.optimizer

    @property
    def over(self) -> bool:
        """Training has ended on this bucket: every reply tells the worker to stop."""
        return bool(self.outbox[1])

    def end(self) -> None:
        self.outbox[1] = 1

    def reply(self, worker: int) -> torch.Tensor:
        """What answers `worker` now: the outbox as it is, or under compressed replies the
        outbox's header and the encoded change since the worker's copy. The server update
        learns what the worker then holds."""
        if self.replies is None:
            self.server_update.held(worker, self.weights)
            return self.outbox
        box = self.replies[worker]
        box[:REPLY_HEADER] = self.outbox[:REPLY_HEADER]
        self.codecs.reply(worker, self.weights, box[REPLY_HEADER:])
        self.server_update.held(worker, self.codecs.replies[worker].copy)
        return box

    def accumulate(self, grad: torch.Tensor, weight: float, scale: float = 1.0,
                   hyper: list[float] | None = None, *,
                   worker: int = 0, applied_next: bool = False) -> None:
        """Add `worker`'s gradient with its batch weight; `scale` shrinks its step, not its
        weight; `hyper`, every setting of its worker's optimizer's groups now (a script's:
        the update steps at its last push's; None: at the run's schedule). `applied_next`:
        `apply` comes before `grad` is written again (a push alone in its update may then be
        the update itself: ServerUpdate.add)."""
        self.hyper = hyper
        alone = applied_next and weight == 1 and scale == 1 and not self.pending_weight
        self.server_update.add(grad[:self.stop - self.start], weight, scale, worker, alone)
        self.pending_weight += weight
        self.pending_share += weight * scale

    def apply(self, optimizer, steps_per_epoch: int) -> None:
        """Apply the pending update (`optimizer`: the run's optimizer settings)."""
        before = self.weights.clone() if self.policy.tracks_change else None
        # The run's schedule, at the epoch the progress is in (small tolerance: weights like
        # 1/3 do not sum to exact integers in floating point); a push's settings win over it.
        lr = lr_at(optimizer, math.floor(self.progress / steps_per_epoch + 1e-6))
        self.server_update.apply(lr, self.hyper, self.pending_weight, self.pending_share)
        if before is not None:
            self.policy.on_update(float((self.weights - before).abs().max()))
        self.progress += self.pending_weight
        self.pending_weight = self.pending_share = 0.0
        self.version += 1
        self.outbox[0], self.outbox[2] = self.version, self.progress

    def take_over(self, weights: torch.Tensor, optimizer: dict | None, steps: int) -> None:
        """Start from another layout's state (a Strategy-Switch's synchronous phase, or a
        checkpoint of another number of servers): its weights, its optimizer's flat state
        for this slice (optim.py; None: a fresh one) and its `steps`, each one update of a
        global batch, so versions and the learning-rate schedule carry on from there."""
        self.weights.copy_(weights)
        if self.codecs is not None:
            self.codecs.restart(self.weights)
        self.server_update.take_over(optimizer)
        self.version, self.progress = steps, float(steps)
        self.outbox[0], self.outbox[2] = steps, steps

    def state_dict(self) -> dict:
        """Weights, version, progress, the pending update, the server update's state (its
        optimizer's among it) and the policy: everything the bucket holds."""
        return {"outbox": self.outbox.clone(), **self.server_update.state_dict(),
                "pending_weight": self.pending_weight, "pending_share": self.pending_share,
                "version": self.version,
                "progress": self.progress, "policy": self.policy.state_dict(),
                "codecs": self.codecs.state_dict() if self.codecs else None}

    def load_state_dict(self, state: dict) -> None:
        self.outbox.copy_(state["outbox"])  # the weights are a view into it
        self.server_update.load_state_dict(state)
        self.pending_weight, self.version = state["pending_weight"], state["version"]
        # A checkpoint from before the share was kept held SGD's state, which does not read it.
        self.pending_share = state.get("pending_share", self.pending_weight)
        self.progress = state["progress"]
        self.policy.load_state_dict(state["policy"])
        if self.codecs is not None:
            self.codecs.load_state_dict(state.get("codecs"))
