"""Decentralised strategies: no parameter servers, the workers keep each other consistent.

- `localsgd`: local SGD with model averaging every tau steps (SparkNet, Moritz et al.,
  "SparkNet: Training Deep Networks in Spark", ICLR 2016; Lin et al., "Don't Use Large
  Mini-Batches, Use Local SGD", ICLR 2020).
- `dpsgd`: decentralised parallel SGD on a ring (Lian et al., "Can Decentralized Algorithms
  Outperform Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic
  Gradient Descent", NIPS 2017).
- `gossip`: GoSGD, asynchronous randomised gossip with sum weights (Blot, Picard, Cord and
  Thome, "Gossip training for deep learning", 2016).

Each worker steps its own FlatSGD (momentum, weight decay, lr schedule) on its own, unweighted
gradient; momentum buffers stay local. No server holds the model, so every strategy ends with a
consensus in `finish()`: all workers replace their model by the weighted mean of all models
(batch shares b_i/B for localsgd and dpsgd, gossip weights alpha_i for gossip) and the job
stores that mean.

Point-to-point messages are tagged above 2**24: PS messages carry bucket ids as tags, and a
float32 header holds ids only up to 2**24, so these tags never meet other traffic.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from polyrhythm.comm.transport import Transport
from polyrhythm.context import RankContext
from polyrhythm.optim import FlatSGD, lr_at
from polyrhythm.strategies.base import Strategy

RING_TAG = 2**24 + 1
GOSSIP_TAG = 2**24 + 2

Value = TypeVar("Value")  # a float, a Fraction or a tensor: the pure functions take any


def average_models(ctx: RankContext, data: torch.Tensor, weight: float) -> None:
    """data <- sum_i weight_i data_i over all workers, in place (Gloo all-reduce).

    The weights must sum to 1 over the workers, as batch shares do.
    """
    with ctx.spans("wait"):
        data.mul_(weight)
        ctx.transport.count_collective(data)
        dist.all_reduce(data)


class DecentralisedWorker(Strategy):
    """Local FlatSGD on the worker's own gradient; subclasses add the communication."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer = FlatSGD(self.flat.data, self.ctx.config)
        self.steps = 0

    def consensus_weight(self) -> float:
        return self.batch_weight

    def local_step(self, epoch: int) -> None:
        with self.ctx.spans("apply"):
            self.optimizer.step(self.flat.grad(), lr_at(self.ctx.config, epoch))
        self.steps += 1


# --- localsgd ------------------------------------------------------------------------------

class LocalSGDWorker(DecentralisedWorker):
    """tau local steps, then every worker's model becomes the batch-weighted mean of all.

    With tau = 1 this is exactly all-reduce SGD: the averaged model and the batch-weighted mean
    of the (unaveraged) momentum buffers follow the same linear recursion as all-reduce SGD's
    model and buffer, so the models agree up to rounding.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tau = self.ctx.config.tau

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        if self.steps % self.tau == 0:
            average_models(self.ctx, self.flat.data, self.batch_weight)

    def finish(self) -> None:
        """Average the steps taken since the last averaging (none if steps % tau == 0)."""
        if self.steps % self.tau:
            average_models(self.ctx, self.flat.data, self.batch_weight)


# --- dpsgd ---------------------------------------------------------------------------------

def ring_neighbours(index: int, n: int) -> list[int]:
    """The distinct other workers next to `index` on a ring of n: none, one (n = 2) or two."""
    return sorted({(index - 1) % n, (index + 1) % n} - {index})


def mixing_weights(index: int, n: int) -> dict[int, float]:
    """Row `index` of D-PSGD's mixing matrix: uniform over the worker and its ring neighbours.

    The matrix is symmetric, so it is doubly stochastic: averaging keeps the mean model.
    """
    members = [index, *ring_neighbours(index, n)]
    return {j: 1.0 / len(members) for j in members}


def mix(models: Mapping[int, Value], weights: Mapping[int, float]) -> Value:
    """sum_j weights[j] models[j]: one row of the mixing matrix applied to the models."""
    return sum(weights[j] * models[j] for j in weights)


class RingExchangeWorker(DecentralisedWorker):
    """D-PSGD: w_i <- sum_j W_ij w_j - lr * update_i, neighbours on a ring.

    Every step the worker sends the model its gradient was computed at to its ring neighbours
    and receives theirs; its optimizer steps meanwhile. The new model is the mixture of the
    sent models minus the optimizer's update: (w_i - lr u_i) + (sum_j W_ij w_j - w_i).
    Traffic: |w| float32 values to each distinct neighbour per step, as many received.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        topology, index = self.ctx.topology, self.ctx.worker_index
        self.weights = mixing_weights(index, topology.workers)
        self.neighbours = {j: topology.worker_ranks[j]
                           for j in ring_neighbours(index, topology.workers)}
        self.outbox = torch.empty(len(self.flat))
        self.inbox = {j: torch.empty(len(self.flat)) for j in self.neighbours}

    def step(self, epoch: int) -> None:
        transport, index = self.ctx.transport, self.ctx.worker_index
        with self.ctx.spans("wait"):
            self.outbox.copy_(self.flat.data)
            receives = [transport.irecv(self.inbox[j], rank, RING_TAG)
                        for j, rank in self.neighbours.items()]
            sends = [transport.isend(self.outbox, rank, RING_TAG)
                     for rank in self.neighbours.values()]
        self.local_step(epoch)  # overlaps the exchange
        with self.ctx.spans("wait"):
            for work in receives + sends:
                work.wait()
        with self.ctx.spans("apply"):
            mixed = mix({index: self.outbox, **self.inbox}, self.weights)
            self.flat.data.add_(mixed.sub_(self.outbox))

    def finish(self) -> None:
        """Consensus: every worker takes the batch-weighted mean of all models."""
        average_models(self.ctx, self.flat.data, self.batch_weight)


# --- gossip --------------------------------------------------------------------------------

def gossip_send_share(alpha: Value) -> tuple[Value, Value]:
    """GoSGD's sender: (alpha it keeps, alpha it sends with its model); they sum to alpha."""
    share = alpha / 2
    return alpha - share, share


def gossip_merge(w_j: Value, alpha_j: Value, w_i: Value, alpha_i: Value
                 ) -> tuple[Value, Value]:
    """GoSGD's receiver j of (w_i, alpha_i): the alpha-weighted mean model and the summed alpha."""
    alpha = alpha_i + alpha_j
    return w_j * (alpha_j / alpha) + w_i * (alpha_i / alpha), alpha


# A gossip message is one float32 tensor: [kind, alpha as the 8 bytes of a float64, w ...].
# alpha travels bit for bit (a float32 would round it), so the alphas keep summing to 1.
MODEL, DONE = 1.0, 2.0
GOSSIP_HEADER = 3


def encode_gossip(out: torch.Tensor, kind: float, alpha: float,
                  w: torch.Tensor | None = None) -> torch.Tensor:
    out[0] = kind
    out[1:GOSSIP_HEADER].view(torch.int32).copy_(
        torch.tensor([alpha], dtype=torch.float64).view(torch.int32))
    if w is not None:
        out[GOSSIP_HEADER:] = w
    return out


def decode_gossip(message: torch.Tensor) -> tuple[float, float, torch.Tensor]:
    """(kind, alpha, w) of a message; w is a view into it."""
    alpha = message[1:GOSSIP_HEADER].view(torch.int32).clone().view(torch.float64).item()
    return message[0].item(), alpha, message[GOSSIP_HEADER:]


class Inbox:
    """Messages from known ranks in arrival order, taken without blocking if need be.

    One thread per rank receives each message into a fresh buffer, queues it and at once posts
    the next receive, until the rank's DONE. Unlike PushReceiver there is no release: a Gloo
    send completes only once its receive is posted, so a sender must not wait for this
    worker's training loop to get round to its previous message (two workers waiting for each
    other's loops would deadlock). Bytes are counted when a message is taken, on one thread.
    """

    def __init__(self, transport: Transport, sources: list[int], numel: int, tag: int) -> None:
        self.transport = transport
        self._arrived: queue.SimpleQueue[tuple[int, torch.Tensor] | Exception] = (
            queue.SimpleQueue())
        for src in sources:
            threading.Thread(target=self._receive, args=(src, numel, tag), daemon=True,
                             name=f"gossip-from-{src}").start()

    def _receive(self, src: int, numel: int, tag: int) -> None:
        try:
            while True:
                message = torch.empty(numel)
                dist.irecv(message, src, tag=tag).wait()
                self._arrived.put((src, message))
                if message[0].item() == DONE:
                    return
        except Exception as exc:  # e.g. the peer died: the caller's next take() raises it
            self._arrived.put(exc)

    def take(self, block: bool) -> tuple[int, torch.Tensor] | None:
        """The next arrived message as (rank, message); None if none is in and not `block`."""
        try:
            item = self._arrived.get(block=block)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        self.transport.count_received(item[1])
        return item


class GossipWorker(DecentralisedWorker):
    """GoSGD: after each local step, merge the models that have arrived, then with
    probability p halve alpha_i and send (w_i, alpha_i) to a uniformly random other worker.

    The alphas of all workers and of the messages in flight always sum to 1 (alpha_i starts at
    1/N). Nobody waits for anybody while training. `finish()` sends DONE to every peer and
    merges every message still in flight until each peer's DONE is in; then all alphas are on
    the workers and the job takes the alpha-weighted mean of all models.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.ctx
        n, index = ctx.topology.workers, ctx.worker_index
        self.alpha = 1.0 / n
        self.p = ctx.config.gossip_p
        self.peers = [r for r in ctx.topology.worker_ranks if r != ctx.rank]
        self.rng = np.random.default_rng([ctx.config.seed, index])
        numel = GOSSIP_HEADER + len(self.flat)
        self.outbox = torch.empty(numel)
        self.sending: dist.Work | None = None
        self.inbox = Inbox(ctx.transport, self.peers, numel, GOSSIP_TAG)
        self.done_peers: set[int] = set()

    def consensus_weight(self) -> float:
        return self.alpha

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        with self.ctx.spans("wait"):
            while (arrived := self.inbox.take(block=False)) is not None:
                self._handle(*arrived)
            if self.peers and self.rng.random() < self.p:
                self._send(self.peers[self.rng.integers(len(self.peers))])

    def _handle(self, src: int, message: torch.Tensor) -> None:
        kind, alpha, w = decode_gossip(message)
        if kind == DONE:  # a faster peer may be done while this worker still trains
            self.done_peers.add(src)
            return
        merged, self.alpha = gossip_merge(self.flat.data, self.alpha, w, alpha)
        self.flat.data.copy_(merged)

    def _send(self, rank: int) -> None:
        if self.sending is not None:  # the peer's receive is always posted: this is short
            self.sending.wait()
        self.alpha, share = gossip_send_share(self.alpha)
        encode_gossip(self.outbox, MODEL, share, self.flat.data)
        self.sending = self.ctx.transport.isend(self.outbox, rank, GOSSIP_TAG)

    def finish(self) -> None:
        with self.ctx.spans("wait"):
            if self.sending is not None:
                self.sending.wait()
            # A DONE follows this worker's last model to each peer (messages between two
            # ranks keep their order); each peer's receive thread waits for it. It is as
            # long as a model message, the size of the receives posted for it.
            done = encode_gossip(self.outbox, DONE, 0.0)
            sends = [self.ctx.transport.isend(done, rank, GOSSIP_TAG) for rank in self.peers]
            while len(self.done_peers) < len(self.peers):
                self._handle(*self.inbox.take(block=True))
            for work in sends:
                work.wait()
        # Consensus: the alpha-weighted mean. Messages in flight have all been merged, so the
        # alphas sum to 1 up to float64 rounding, which dividing by their sum removes.
        total = torch.tensor([self.alpha], dtype=torch.float64)
        with self.ctx.spans("wait"):
            self.ctx.transport.count_collective(total)
            dist.all_reduce(total)
        average_models(self.ctx, self.flat.data, self.alpha / total.item())
