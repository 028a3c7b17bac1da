"""One parameter-server shard: a flat slice of the parameters, split into buckets, and one loop.

The loop is the same for every consistency model: receive a push from any worker, decide
what to do with it (strategies/serving.py, which asks the bucket's policy; the simulator
decides with the same function), accumulate / apply / reply (message layout in
comm/messages.py).
Each bucket is an independent key, as in ps-lite: its own version, optimizer state and policy,
so a bucket is updated and sent back as soon as its gradients are in, while workers are still
computing the rest of backward.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

import torch

from polyrhythm.comm.messages import (
    HANDOVER,
    HANDOVER_HEADER,
    PUSH_HEADER,
    REPLY_HEADER,
    RUN_SCHEDULE,
)
from polyrhythm.comm.transport import PeerLost
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import RankContext
from polyrhythm.metrics.recorder import StalenessLog
from polyrhythm.optim import (
    StateKeys,
    Updater,
    cut,
    joined,
    lr_at,
    state_keys,
    state_of,
    updater,
)
from polyrhythm.runtime import checkpoint
from polyrhythm.strategies.consistency import ConsistencyPolicy
from polyrhythm.strategies.serving import DONE, Course, Served, serve

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
                 make_updater: MakeUpdater) -> None:
        self.start, self.stop = start, stop
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
        self.version = 0  # weight updates applied so far
        self.progress = 0.0  # global batches' worth of gradient applied (drives lr decay)
        self.lr = RUN_SCHEDULE  # the rate the last push carried (a script's scheduler)

    @property
    def over(self) -> bool:
        """Training has ended on this bucket: every reply tells the worker to stop."""
        return bool(self.outbox[1])

    def end(self) -> None:
        self.outbox[1] = 1

    def accumulate(self, grad: torch.Tensor, weight: float, scale: float = 1.0,
                   lr: float = RUN_SCHEDULE) -> None:
        """Add a gradient with its batch weight; `scale` shrinks its step, not its weight;
        `lr`, the rate its worker's optimizer steps at now (RUN_SCHEDULE: the run's
        schedule's)."""
        self.lr = lr
        self.pending.add_(grad[:self.stop - self.start], alpha=weight * scale)
        self.pending_weight += weight
        self.pending_share += weight * scale

    def apply(self, optimizer, steps_per_epoch: int) -> None:
        """Apply the pending update (`optimizer`: the run's optimizer settings)."""
        policy = self.policy
        before = self.weights.clone() if policy.tracks_change else None
        if policy.averages:  # the (batch-weighted) mean of the gradients received
            self.pending.div_(self.pending_weight)
        if self.update is not self.pending:
            self.update.copy_(self.pending)
        if policy.elastic:
            self.weights.add_(self.update)
        else:
            # Small tolerance: weights like 1/3 do not sum to exact integers in floating point.
            epoch = math.floor(self.progress / steps_per_epoch + 1e-6)
            self._step(lr_at(optimizer, epoch) if self.lr < 0 else self.lr)
        if before is not None:
            policy.on_update(float((self.weights - before).abs().max()))
        self.pending.zero_()
        self.progress += self.pending_weight
        self.pending_weight = self.pending_share = 0.0
        self.version += 1
        self.outbox[0], self.outbox[2] = self.version, self.progress

    def _step(self, lr: float) -> None:
        """Step the optimizer by the update. One whose step is not linear in the gradient
        (Adam: the gradient's scale cancels out) gets the mean gradient, and its learning
        rate is scaled by the share of a global batch the update is (an asynchronous push's
        batch share, a staleness-aware scale), as a linear one's step is by the gradient."""
        if not self.optimizer.linear and self.pending_weight > 0:
            share = self.pending_share
            if self.policy.averages:
                share /= self.pending_weight
            if share > 0 and share != 1:
                self.update.div_(share)
                lr *= share
        self.optimizer.step(self.update, lr)

    def take_over(self, weights: torch.Tensor, optimizer: dict | None, steps: int) -> None:
        """Start from another layout's state (a Strategy-Switch's synchronous phase, or a
        checkpoint of another number of servers): its weights, its optimizer's flat state
        for this slice (optim.py; None: a fresh one) and its `steps`, each one update of a
        global batch, so versions and the learning-rate schedule carry on from there. An
        elastic centre has no optimizer to fill."""
        self.weights.copy_(weights)
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
                "optimizer": self.optimizer.state_dict() if self.optimizer else None}

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


class ParameterServerShard:
    """Owns the buckets of one server and applies workers' gradients to them."""

    def __init__(self, ctx: RankContext, initial: torch.Tensor,
                 buckets: dict[int, tuple[int, int]], capacity: int, make_policy,
                 steps_per_epoch: int, handover: bool = False,
                 make_updater: MakeUpdater | None = None,
                 handover_keys: StateKeys | None = None) -> None:
        """`make_updater(weights, start, stop, concurrency)`: a bucket's optimizer (the
        run's, by default; a script's user optimizer: optim.OptimizerSpec).
        `handover_keys`: the optimizer state a Strategy-Switch's handover carries, the keys
        of the workers' optimizer (the run's by default; a script's: its spec's)."""
        self.ctx = ctx
        # Strategy-Switch: idle until worker 0 hands over the synchronous phase's state.
        self.handover = handover
        self.handover_keys = handover_keys
        self.switched: bool | None = None
        make_updater = make_updater or partial(run_updater, ctx.config.optimizer)
        self.buckets = {k: Bucket(initial, a, b, make_policy(), make_updater)
                        for k, (a, b) in buckets.items()}
        self.capacity = capacity  # elements in the largest bucket: pushes are padded to it
        self.steps_per_epoch = steps_per_epoch
        # Global batches in the run: policies with fixed rounds end after as many updates,
        # shared epochs once this much gradient is applied.
        self.course = Course(steps_per_epoch * ctx.config.epochs, ctx.config.shared_epochs)
        self.staleness = StalenessLog()
        self.record = ctx.config.instrumentation
        self.pushes: list[tuple] = []  # (server, t, worker, staleness, queue) per gradient
        self.updates: list[tuple] = []  # (server, t, seconds) per weight update
        # Checkpoints: after every `checkpoint_every` epochs' worth of global batches.
        self.every = ctx.config.checkpoint_every
        self.checkpointed = 0  # epochs done at the last checkpoint written
        # on_worker_failure = continue: a worker whose connection breaks leaves as if done.
        self.continues = ctx.config.on_worker_failure == CONTINUE
        self.lost: dict[int, dict] = {}  # by rank: when it was lost and its pushes by then

    def resume(self, resume) -> None:
        """Carry on from a checkpoint: its server files if it has them (none: the model was
        with the workers, as before a Strategy-Switch). Written by as many servers as now,
        each bucket loads as it was; by another number, the flat model is re-sliced and each
        bucket starts from its slice, the version and the progress."""
        if not resume.servers_expected:
            return
        states = resume.server_states()
        epochs_done = int(resume.folder.name.split("-")[1])
        self.checkpointed = epochs_done
        self.handover, self.switched = False, True if self.handover else self.switched
        mine = states[self.ctx.rank] if resume.servers == self.ctx.topology.servers else None
        if mine is not None and mine["ranges"] == [(b.start, b.stop)
                                                   for b in self.buckets.values()]:
            self.load_state_dict(mine)
            return
        buckets = [b for s in states for b in s["buckets"].values()]
        weights = torch.cat([b["outbox"][REPLY_HEADER:] for b in buckets])
        optimizers = [b["optimizer"] for b in buckets]
        whole = joined(optimizers) if optimizers[0] is not None else None
        for bucket in self.buckets.values():
            a, b = bucket.start, bucket.stop
            bucket.take_over(weights[a:b], None if whole is None else cut(whole, a, b),
                             buckets[0]["version"])
            bucket.progress = buckets[0]["progress"]
            bucket.outbox[2] = bucket.progress

    def run(self) -> None:
        """Serve until every worker has said it is done for every bucket, or is lost."""
        topology = self.ctx.topology
        if self.handover:
            self.receive_handover()
        pushes = self.ctx.transport.receiver(topology.worker_ranks, PUSH_HEADER + self.capacity)
        unfinished = dict.fromkeys(topology.worker_ranks, len(self.buckets))
        while unfinished:
            try:
                src, inbox = pushes.take()
            except PeerLost as gone:
                if not self.continues or gone.rank not in unfinished:
                    raise
                self._lose(gone.rank)
                del unfinished[gone.rank]
                continue
            worker = topology.worker_index(src)
            kind, clock, pulled, weight, key, lr = inbox[:PUSH_HEADER].tolist()
            kind, bucket = int(kind), self.buckets[int(key)]
            served = serve(bucket, self.course, kind, worker, int(clock), int(pulled), weight)
            if served.decision.accumulate:  # before the release: the values are in `inbox`
                bucket.accumulate(inbox[PUSH_HEADER:], weight, served.decision.scale, lr)
                self.staleness.record(served.staleness)
                if self.record:
                    self.pushes.append((self.ctx.rank, self.ctx.now(), worker,
                                        served.staleness, pushes.waiting()))
            if kind & DONE:
                unfinished[src] -= 1
            more = unfinished[src] > 0
            if not more:
                del unfinished[src]
            pushes.release(src, more)
            self._act(int(key), bucket, served)

    def receive_handover(self) -> None:
        """Wait for worker 0's handover (comm/messages.py) and start every bucket from it.
        No push can come before it: the workers push only once the switch is made."""
        sizes = [b.stop - b.start for b in self.buckets.values()]
        keys = self.handover_keys or state_keys(self.ctx.config.optimizer)
        elementwise, scalars = keys
        total = sum(sizes)
        box = torch.empty(HANDOVER_HEADER + (1 + len(elementwise)) * total + len(scalars))
        self.ctx.transport.irecv(box, self.ctx.topology.worker_ranks[0], tag=HANDOVER).wait()
        switched, steps = box[:HANDOVER_HEADER].tolist()
        weights, *tensors = box[HANDOVER_HEADER:box.numel() - len(scalars)].split(total)
        values = box[box.numel() - len(scalars):].tolist()
        by_bucket = zip(weights.split(sizes), *(t.split(sizes) for t in tensors), strict=True)
        for bucket, (w, *pieces) in zip(self.buckets.values(), by_bucket, strict=True):
            bucket.take_over(w, state_of(pieces, values, keys), int(steps))
        self.switched = bool(switched)
        # The workers checkpointed the epochs before the switch themselves. Their checkpoint
        # of the epoch the switch followed holds their switched state: it is complete with
        # this server's as it is now, before any push.
        done = int(steps) // self.steps_per_epoch
        self.checkpointed = done
        if switched and self.ctx.run_dir is not None and checkpoint.is_due(self.ctx.config, done):
            self._save(done)

    def _act(self, key: int, bucket: Bucket, served: Served) -> None:
        if served.update:
            began = self.ctx.now()
            with self.ctx.spans("update"):
                bucket.apply(self.ctx.config.optimizer, self.steps_per_epoch)
            if self.record:
                self.updates.append((self.ctx.rank, began, self.ctx.now() - began))
            if served.ends:
                bucket.end()
            self._checkpoint()
        ranks = [r for r in (self.ctx.topology.worker_ranks[w] for w in served.decision.release)
                 if r not in self.lost]
        for work in [self._send(bucket.outbox, r, key) for r in ranks]:
            try:
                if work is not None:
                    work.wait()
            except PeerLost:  # the worker died: its receive fails too, and says so
                if not self.continues:
                    raise

    def _send(self, outbox: torch.Tensor, rank: int, key: int):
        """Start a reply; None if the worker's connection is already broken (continue)."""
        try:
            return self.ctx.transport.isend(outbox, rank, tag=key)
        except PeerLost:
            if not self.continues:
                raise
            return None

    def _lose(self, rank: int) -> None:
        """Worker `rank` died (on_worker_failure = continue): every bucket's policy lets it
        go as if it were done, so nobody waits for it, and the run goes on."""
        worker = self.ctx.topology.worker_index(rank)
        first = next(iter(self.buckets.values()))
        self.lost[rank] = {"worker": worker, "rank": rank, "at_s": self.ctx.now(),
                           "pushes": first.policy.clocks.get(worker, 0)}
        for key, bucket in self.buckets.items():  # as if it had said DONE (it sent nothing)
            self._act(key, bucket, serve(bucket, self.course, DONE, worker, 0, 0, 0.0))

    def _checkpoint(self) -> None:
        """Once every bucket has the next checkpoint's epochs' worth of global batches
        (tolerance: batch shares like 1/3 do not add up exactly), write this server's file."""
        ctx, config = self.ctx, self.ctx.config
        if ctx.run_dir is None or not self.every:
            return
        epochs = min(b.progress for b in self.buckets.values()) / self.steps_per_epoch
        due = min(self.checkpointed + self.every, config.epochs)
        if due <= self.checkpointed or epochs < due - 1e-6:
            return
        self._save(due)

    def _save(self, epochs_done: int) -> None:
        """Write this server's file of the checkpoint after `epochs_done` epochs."""
        ctx, config, own = self.ctx, self.ctx.config, f"server-{self.ctx.rank}.pt"
        checkpoint.save(self.state_dict(), checkpoint.epoch_dir(ctx.run_dir, epochs_done) / own)
        checkpoint.prune(ctx.run_dir, [own], config.workers, config.servers)
        self.checkpointed = epochs_done

    def state_dict(self) -> dict:
        """Every bucket's state, by bucket id, and the buckets' places in the flat model."""
        return {"buckets": {k: b.state_dict() for k, b in self.buckets.items()},
                "ranges": [(b.start, b.stop) for b in self.buckets.values()]}

    def load_state_dict(self, state: dict) -> None:
        for k, bucket in self.buckets.items():
            bucket.load_state_dict(state["buckets"][k])

    def report(self, lost: set[int]) -> dict:
        """This server's report; `lost`: the workers every survivor agrees were lost
        (indices), those gone after their last message to this server included."""
        first = next(iter(self.buckets.values())).policy
        for w in sorted(lost):
            rank = self.ctx.topology.worker_ranks[w]
            self.lost.setdefault(rank, {"worker": w, "rank": rank, "at_s": None,
                                        "pushes": first.clocks.get(w, 0)})
        buckets = list(self.buckets.values())
        start, stop = buckets[0].start, buckets[-1].stop
        return {
            "role": "server",
            "rank": self.ctx.rank,
            "shard": (start, stop, torch.cat([b.weights for b in buckets])),
            "weight_updates": max(b.version for b in buckets),
            "buckets": len(buckets),
            # SGD's momentum as corrected for asynchrony; None for other optimizers.
            "momentum": getattr(buckets[0].optimizer, "momentum", None),
            "update_s": self.ctx.spans.totals["update"],
            "staleness_histogram": dict(self.staleness.histogram),
            "traffic": self.ctx.transport.counters.snapshot(),
            "pushes": self.pushes,
            "updates": self.updates,
            "finished_at": time.time(),
            "switched": self.switched,  # None: not a Strategy-Switch run
            "lost": list(self.lost.values()),
        }
