"""The workers of the decentralised strategies (declared in strategies/decentralised.py):
local SGD, D-PSGD and GoSGD.

Each worker steps its own copy of the run's optimizer (optim.updater; lr schedule) on its own,
unweighted gradient; its state (momentum buffers, moments) stays local. No server holds the
model, so every strategy ends with a consensus in `finish()`: all workers replace their model
by the weighted mean of all models (batch shares b_i/B for localsgd and dpsgd, gossip weights
alpha_i for gossip) and the job stores that mean.

Point-to-point messages are tagged above 2**24: PS messages carry bucket ids as tags, and a
float32 header holds ids only up to 2**24, so these tags never meet other traffic.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.transport import WORKERS
from polyrhythm.context import RankContext
from polyrhythm.optim import lr_at
from polyrhythm.strategies.base import Strategy
from polyrhythm.strategies.cadence import GossipCoin, Periodic
from polyrhythm.strategies.decentralised import (
    gossip_merge,
    gossip_send_share,
    mix,
    mixing_weights,
    ring_neighbours,
)

RING_TAG = 2**24 + 1
GOSSIP_TAG = 2**24 + 2


def average_models(ctx: RankContext, data: torch.Tensor, weight: float) -> None:
    """data <- sum_i weight_i data_i over all workers, in place (an all-reduce).

    The weights must sum to 1 over the workers, as batch shares do.
    """
    with ctx.spans("wait"):
        data.mul_(weight)
        ctx.transport.all_reduce(data, WORKERS)


class DecentralisedWorker(Strategy):
    """The run's optimizer on the worker's own gradient; subclasses add the communication."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer = self.local_optimizer()

    def consensus_weight(self) -> float:
        return self.batch_weight

    def local_step(self, epoch: int) -> None:
        with self.ctx.spans("apply"):
            self.optimizer.step(self.flat.grad(), lr_at(self.ctx.config.optimizer, epoch))

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


class LocalSGDWorker(DecentralisedWorker):
    """tau local steps, then every worker's model becomes the batch-weighted mean of all.

    With tau = 1 this is exactly all-reduce SGD: the averaged model and the batch-weighted mean
    of the (unaveraged) momentum buffers follow the same linear recursion as all-reduce SGD's
    model and buffer, so the models agree up to rounding.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cadence = Periodic(self.settings.tau)

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        if self.cadence.step():
            average_models(self.ctx, self.flat.data, self.batch_weight)

    def finish(self) -> None:
        """Average the steps taken since the last averaging (none if steps % tau == 0)."""
        if self.cadence.owed:
            average_models(self.ctx, self.flat.data, self.batch_weight)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "cadence": self.cadence.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cadence.load_state_dict(state["cadence"])


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


class GossipWorker(DecentralisedWorker):
    """GoSGD: after each local step, merge the models that have arrived, then, when the
    `GossipCoin` says so, halve alpha_i and send (w_i, alpha_i) to that peer.

    The alphas of all workers and of the messages in flight always sum to 1 (alpha_i starts at
    1/N). Nobody waits for anybody while training. `finish()` sends DONE to every peer and
    merges every message still in flight until each peer's DONE is in; then all alphas are on
    the workers and the job takes the alpha-weighted mean of all models.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.ctx
        self.alpha = 1.0 / ctx.topology.workers
        self.peers = [r for r in ctx.topology.worker_ranks if r != ctx.rank]
        self.cadence = GossipCoin(self.settings.gossip_p, len(self.peers), ctx.config.seed,
                                  ctx.worker_index)
        self.outbox = torch.empty(GOSSIP_HEADER + len(self.flat))
        self.sending = None
        self.inbox = None
        self.done_peers: set[int] = set()

    def consensus_weight(self) -> float:
        return self.alpha

    def start(self) -> None:
        self.inbox = self.ctx.transport.receiver(self.peers, len(self.outbox), GOSSIP_TAG,
                                                 last=lambda message: message[0] == DONE)

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        with self.ctx.spans("wait"):
            while (arrived := self.inbox.take(block=False)) is not None:
                self._handle(*arrived)
            peer = self.cadence.step()
            if peer is not None:
                self._send(self.peers[peer])

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
            self.ctx.transport.all_reduce(total, WORKERS)
        average_models(self.ctx, self.flat.data, self.alpha / total.item())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "alpha": self.alpha,
                "cadence": self.cadence.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.alpha = state["alpha"]
        self.cadence.load_state_dict(state["cadence"])
