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

import time
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial

import torch

from polyrhythm.comm.messages import HANDOVER, HANDOVER_HEADER, PUSH_HEADER, REPLY_HEADER
from polyrhythm.comm.transport import PeerFault, PeerLost
from polyrhythm.compression.buckets import BucketCodecs, compressing
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import RankContext
from polyrhythm.metrics.recorder import StalenessLog
from polyrhythm.optim import StateKeys, cut, joined, state_keys, state_of
from polyrhythm.runtime import checkpoint
from polyrhythm.runtime.server.bucket import Bucket, MakeServerUpdate, MakeUpdater, run_updater
from polyrhythm.strategies.serving import DONE, Course, Served, serve

PUSH_INTS, UPDATE_INTS = (0, 2, 3, 4), (0,)  # the integer fields of the records' rows


class ParameterServerShard:
    """Owns the buckets of one server and applies workers' gradients to them."""

    def __init__(self, ctx: RankContext, initial: torch.Tensor,
                 buckets: dict[int, tuple[int, int]], capacity: int, make_policy,
                 make_update: MakeServerUpdate, steps_per_epoch: int, handover: bool = False,
                 make_updater: MakeUpdater | None = None,
                 handover_keys: StateKeys | None = None,
                 shapes: Sequence[Sequence[int]] = ()) -> None:
        """`make_policy()`: a bucket's consistency policy; `make_update(weights, combines=,
        make_optimizer=)`: its server update (strategies/server_updates/).
        `make_updater(weights, start, stop, concurrency)`: a bucket's optimizer (the
        run's, by default; a script's user optimizer: optim.OptimizerSpec).
        `handover_keys`: the optimizer state a Strategy-Switch's handover carries, the keys
        of the workers' optimizer (the run's by default; a script's: its spec's). `shapes`:
        the model's parameters', in flat order (a compressor's matrices follow them);
        `capacity`: the words of the server's largest push."""
        self.ctx = ctx
        # Strategy-Switch: idle until worker 0 hands over the synchronous phase's state.
        self.handover = handover
        self.handover_keys = handover_keys
        self.switched: bool | None = None
        make_updater = make_updater or partial(run_updater, ctx.config.optimizer)
        config = ctx.config

        def codecs(k: int, a: int, b: int) -> BucketCodecs | None:
            if not compressing(config.compression):
                return None
            return BucketCodecs(config.compression, a, b, shapes, initial[a:b],
                                config.workers, k, config.seed)
        self.buckets = {k: Bucket(initial, a, b, make_policy(), make_update, make_updater,
                                  codecs(k, a, b))
                        for k, (a, b) in buckets.items()}
        self.capacity = capacity  # words in the largest push: every push is padded to it
        self.steps_per_epoch = steps_per_epoch
        # Global batches in the run: policies with fixed rounds end after as many updates,
        # shared epochs once this much gradient is applied.
        self.course = Course(steps_per_epoch * ctx.config.epochs, ctx.config.shared_epochs)
        self.staleness = StalenessLog()
        self.record = ctx.config.instrumentation
        self.pushes: list[tuple] = []  # (server, t, worker, staleness, queue) per gradient
        self.updates: list[tuple] = []  # (server, t, seconds) per weight update
        self.resumed_s = 0.0  # resumed: the job's clock at the checkpoint (engine.py's)
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
        self._resume_records(states)
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
        # Compressed replies: each worker's copy of the model, whole, to re-slice too.
        kept = [b.get("codecs") for b in buckets]
        copies = None if kept[0] is None else [torch.cat(c) for c in zip(
            *(k["copies"] for k in kept), strict=True)]
        for bucket in self.buckets.values():
            a, b = bucket.start, bucket.stop
            bucket.take_over(weights[a:b], None if whole is None else cut(whole, a, b),
                             buckets[0]["version"])
            bucket.progress = buckets[0]["progress"]
            bucket.outbox[2] = bucket.progress
            if copies is not None and bucket.codecs is not None:
                bucket.codecs.restart_copies([c[a:b] for c in copies])

    def run(self) -> None:
        """Serve until every worker has said it is done for every bucket, or is lost."""
        topology = self.ctx.topology
        if self.handover:
            self.receive_handover()
        # A script's optimizer's settings ride between the header and the values.
        head = PUSH_HEADER + self.ctx.push_hyper_words
        pushes = self.ctx.transport.receiver(topology.worker_ranks, head + self.capacity)
        unfinished = dict.fromkeys(topology.worker_ranks, len(self.buckets))
        while unfinished:
            try:
                src, inbox = pushes.take()
            except PeerFault as gone:  # its connection broke, or it fell silent (cut off)
                if not self.continues or gone.rank not in unfinished:
                    raise
                self._lose(gone.rank)
                del unfinished[gone.rank]
                continue
            worker = topology.worker_index(src)
            kind, clock, pulled, weight, key = inbox[:PUSH_HEADER].tolist()
            kind, bucket = int(kind), self.buckets[int(key)]
            served = serve(bucket, self.course, kind, worker, int(clock), int(pulled), weight)
            if served.decision.accumulate:  # before the release: the values are in `inbox`
                values = inbox[head:]
                # Copied out first: float64 words after an odd header are not 8-byte aligned.
                hyper = (inbox[PUSH_HEADER:head].clone().view(torch.float64).tolist()
                         if head > PUSH_HEADER else None)
                if bucket.codecs is not None:
                    with self.ctx.spans("compress"):
                        values = bucket.codecs.gradient(values)
                bucket.accumulate(values, weight, served.decision.scale, hyper,
                                  worker=worker, applied_next=served.update)
                self.staleness.record(served.staleness)
                if self.record:
                    self.pushes.append((self.ctx.rank, self.ctx.now(), worker,
                                        served.staleness, pushes.waiting()))
            if kind & DONE:
                unfinished[src] -= 1
            more = unfinished[src] > 0
            if not more:
                del unfinished[src]
            self._update(bucket, served)  # before the release: it may read `inbox`
            pushes.release(src, more)
            self._answer(int(key), bucket, served)

    def receive_handover(self) -> None:
        """Wait for the handover (comm/messages.py) and start every bucket from it: worker
        0's, or where the run goes on without a lost worker, the first worker's left. No push
        can come before it: the workers push only once the switch is made."""
        sizes = [b.stop - b.start for b in self.buckets.values()]
        keys = self.handover_keys or state_keys(self.ctx.config.optimizer)
        elementwise, scalars = keys
        total = sum(sizes)
        box = torch.empty(HANDOVER_HEADER + (1 + len(elementwise)) * total + len(scalars))
        workers, transport = self.ctx.topology.worker_ranks, self.ctx.transport
        if self.continues:
            transport.receive_first(box, workers, HANDOVER, self.ctx.config.timeout)
        else:
            transport.irecv(box, workers[0], tag=HANDOVER).wait()
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

    def _update(self, bucket: Bucket, served: Served) -> None:
        if served.update:
            began = self.ctx.now()
            with self.ctx.spans("update"):
                bucket.apply(self.ctx.config.optimizer, self.steps_per_epoch)
            if self.record:
                self.updates.append((self.ctx.rank, began, self.ctx.now() - began))
            if served.ends:
                bucket.end()

    def _answer(self, key: int, bucket: Bucket, served: Served) -> None:
        """Send the replies the decision releases; checkpoint after an update."""
        ranks = {w: r for w, r in ((w, self.ctx.topology.worker_ranks[w])
                                   for w in served.decision.release) if r not in self.lost}
        # Encoding compressed replies is the compress span's; the outbox as it is, nothing's.
        with self.ctx.spans("compress") if bucket.replies is not None else nullcontext():
            replies = {w: bucket.reply(w) for w in ranks}
        for work in [self._send(replies[w], r, key) for w, r in ranks.items()]:
            try:
                if work is not None:  # going on without a silent worker: never Gloo's timeout
                    work.wait(self.ctx.config.timeout if self.continues else None)
            except PeerFault:  # the worker died or is cut off: its receive fails too, and says so
                if not self.continues:
                    raise
        if served.update:
            # After the replies: under compressed replies a worker's copy held by this
            # server must be what the worker holds when it checkpoints the same epoch.
            self._checkpoint()

    def _send(self, outbox: torch.Tensor, rank: int, key: int):
        """Start a reply; None if the worker's connection is already broken (continue)."""
        try:
            return self.ctx.transport.isend(outbox, rank, tag=key)
        except PeerFault:
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
        config = self.ctx.config
        left = config.workers - len(self.lost)
        if left < config.min_workers:  # the run ends, explained by the worker lost
            raise PeerLost(rank, RuntimeError(f"{left} workers would be left, fewer than "
                                              f"min_workers {config.min_workers}"))
        for key, bucket in self.buckets.items():  # as if it had said DONE (it sent nothing)
            served = serve(bucket, self.course, DONE, worker, 0, 0, 0.0)
            self._update(bucket, served)
            self._answer(key, bucket, served)

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
        """Write this server's file of the checkpoint after `epochs_done` epochs: its state,
        and its records so far with the job's clock now, for a resumed run to go on with."""
        ctx, config, own = self.ctx, self.ctx.config, f"server-{self.ctx.rank}.pt"
        records = {"clock": ctx.now(), "pushes": checkpoint.packed(self.pushes),
                   "updates": checkpoint.packed(self.updates)}
        checkpoint.save(self.state_dict() | records,
                        checkpoint.epoch_dir(ctx.run_dir, epochs_done) / own)
        checkpoint.complete_model(ctx.run_dir, epochs_done, config.workers, config.servers)
        checkpoint.prune(ctx.run_dir, [own], config.workers, config.servers)
        self.checkpointed = epochs_done

    def _resume_records(self, states: list[dict]) -> None:
        """The records the checkpoint's servers kept (each old server's with one of the
        servers now, should their number have changed) and the clock to go on from."""
        mine = states[self.ctx.rank::self.ctx.topology.servers]
        self.resumed_s = max(s.get("clock", 0.0) for s in states)
        for state in (s for s in mine if "clock" in s):  # one written before they were kept
            self.pushes += checkpoint.unpacked(state["pushes"], PUSH_INTS)
            self.updates += checkpoint.unpacked(state["updates"], UPDATE_INTS)

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
            "compress_s": self.ctx.spans.totals["compress"],
            "staleness_histogram": dict(self.staleness.histogram),
            "traffic": self.ctx.transport.counters.snapshot(),
            "pushes": self.pushes,
            "updates": self.updates,
            "finished_at": time.time(),
            "switched": self.switched,  # None: not a Strategy-Switch run
            "lost": list(self.lost.values()),
        }
