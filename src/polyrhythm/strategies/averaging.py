"""The workers of the decentralised strategies (declared in strategies/decentralised.py):
local SGD and D-PSGD here, GoSGD in strategies/gossip.py.

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
from polyrhythm.compression.buckets import codec, compressing
from polyrhythm.compression.feedback import ChangeSender, Copy
from polyrhythm.compression.wire import codec_seed
from polyrhythm.context import RankContext
from polyrhythm.optim import lr_at
from polyrhythm.strategies.allreduce import gradient_sum
from polyrhythm.strategies.base import Strategy
from polyrhythm.strategies.cadence import Periodic
from polyrhythm.strategies.decentralised import (
    mix,
    mixing_weights,
    ring_neighbours,
)

RING_TAG = 2**24 + 1
GOSSIP_TAG = 2**24 + 2


def average_models(ctx: RankContext, data: torch.Tensor, weight: float) -> None:
    """data <- sum_i weight_i data_i over all workers, in place (an all-reduce).

    The weights must sum to 1 over the workers, as batch shares do. Where the workers may
    change (comm/membership.py), the sum carries the weights too: once a worker is lost the
    mean is over those left, their weights divided by what they sum to.
    """
    with ctx.spans("wait"):
        if ctx.transport.membership is None:
            data.mul_(weight)
            ctx.transport.all_reduce(data, WORKERS)
            return
        carried = torch.cat([data * weight, torch.tensor([weight])])
        ctx.transport.all_reduce(carried, WORKERS)
        if ctx.transport.membership.changes:  # else they sum to 1, as before
            carried[:-1].div_(carried[-1])
        data.copy_(carried[:-1])


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

    Under compression the workers average their changes since the last average, which every
    worker holds alike (`reference`), compressed (comm/compressed.py): the new model is the
    reference plus the decoded mean change, the same on every worker.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cadence = Periodic(self.settings.tau)
        self.compressed = gradient_sum(self)
        self.reference = self.flat.data.clone() if self.compressed else None

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        if self.cadence.step():
            self._average()

    def _average(self) -> None:
        if self.compressed is None:
            average_models(self.ctx, self.flat.data, self.batch_weight)
            return
        change = (self.flat.data - self.reference).mul_(self.batch_weight)
        self.compressed(change)
        self.reference.add_(change)
        self.flat.data.copy_(self.reference)

    def finish(self) -> None:
        """Average the steps taken since the last averaging (none if steps % tau == 0)."""
        if self.cadence.owed:
            self._average()

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "cadence": self.cadence.state_dict()}
        if self.compressed is not None:
            state |= {"compressed": self.compressed.state_dict(),
                      "reference": self.reference.clone()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cadence.load_state_dict(state["cadence"])
        if self.compressed is not None and "compressed" in state:
            self.compressed.load_state_dict(state["compressed"])
            self.reference.copy_(state["reference"])


class RingExchangeWorker(DecentralisedWorker):
    """D-PSGD: w_i <- sum_j W_ij w_j - lr * update_i, neighbours on a ring.

    Every step the worker sends the model its gradient was computed at to its ring neighbours
    and receives theirs; its optimizer steps meanwhile. The new model is the mixture of the
    sent models minus the optimizer's update: (w_i - lr u_i) + (sum_j W_ij w_j - w_i).
    Traffic: |w| float32 values to each distinct neighbour per step, as many received.

    Under compression each worker's model travels as its change since the copy its
    neighbours hold of it, and the mixture is of those copies (CHOCO-SGD's public copies,
    Koloskova, Stich and Jaggi, ICML 2019, with a consensus step of 1): one message to both
    neighbours, what it leaves out sent in later ones.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        topology, index = self.ctx.topology, self.ctx.worker_index
        self.weights = mixing_weights(index, topology.workers)
        self.neighbours = {j: topology.worker_ranks[j]
                           for j in ring_neighbours(index, topology.workers)}
        self.sender, self.copies = None, {}
        settings, n = self.ctx.config.compression, len(self.flat)
        if compressing(settings):
            def made(j: int) -> object:
                return codec(settings, 0, n, self.flat.shapes,
                             codec_seed(self.ctx.config.seed, RING_TAG, j))
            self.sender = ChangeSender(made(index), self.flat.data)
            self.copies = {j: Copy(made(j), self.flat.data) for j in self.neighbours}
        words = self.sender.codec.words if self.sender else n
        self.outbox = torch.empty(words)
        self.inbox = {j: torch.empty(words) for j in self.neighbours}

    def step(self, epoch: int) -> None:
        transport, index = self.ctx.transport, self.ctx.worker_index
        if transport.membership is not None:
            self._step_among_members(epoch)
            return
        if self.sender is not None:
            with self.ctx.spans("compress"):
                self.sender.encode(self.flat.data, self.outbox)
        with self.ctx.spans("wait"):
            if self.sender is None:
                self.outbox.copy_(self.flat.data)
            receives = [transport.irecv(self.inbox[j], rank, RING_TAG)
                        for j, rank in self.neighbours.items()]
            sends = [transport.isend(self.outbox, rank, RING_TAG)
                     for rank in self.neighbours.values()]
        self.local_step(epoch)  # overlaps the exchange
        with self.ctx.spans("wait"):
            for work in receives + sends:
                work.wait()
        if self.sender is None:
            own, theirs = self.outbox, self.inbox
        else:
            with self.ctx.spans("compress"):
                own = self.sender.copy
                theirs = {j: self.copies[j].apply(self.inbox[j]) for j in self.neighbours}
        with self.ctx.spans("apply"):
            mixed = mix({index: own, **theirs}, self.weights)
            self.flat.data.add_(mixed.sub_(own))

    def _step_among_members(self, epoch: int) -> None:
        """The step where the workers may change (comm/membership.py; uncompressed): the
        ring is over the workers left, each step's, and the mixture weighs the worker and
        its neighbours on it alike. The exchange follows the optimizer's step (one call
        that regroups and redoes it where a worker was lost); a worker the others went on
        past (they completed the exchange as one was lost) keeps its own model that step."""
        if not self._clean:  # a send of the exchange that did not complete may still read it
            self.outbox = torch.empty_like(self.outbox)
        self.outbox.copy_(self.flat.data)
        self.local_step(epoch)
        with self.ctx.spans("wait"):
            received = self.ctx.transport.membership.exchange(self._plan)
        if received is None:
            return
        self._clean = True
        members = self.ctx.transport.members(WORKERS)
        me = members.index(self.ctx.rank)
        theirs = {members.index(rank): box for rank, box in received.items()}
        with self.ctx.spans("apply"):
            mixed = mix({me: self.outbox, **theirs}, mixing_weights(me, len(members)))
            self.flat.data.add_(mixed.sub_(self.outbox))

    _clean = True  # every receive of the last exchange landed: its buffers may serve again

    def _plan(self, members: list[int]) -> tuple[dict, dict]:
        """This worker's ring neighbours among `members`: the outbox to each, and a buffer
        from each (fresh after an exchange that did not complete: a message of it may still
        land in the old)."""
        me = members.index(self.ctx.rank)
        ranks = [members[j] for j in ring_neighbours(me, len(members))]
        if not self._clean or sorted(self.inbox) != ranks:
            self.inbox = {rank: torch.empty_like(self.outbox) for rank in ranks}
        self._clean = False
        return dict.fromkeys(ranks, self.outbox), self.inbox

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.sender is not None:
            state |= {"sender": self.sender.state_dict(),
                      "copies": {j: c.state_dict() for j, c in self.copies.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.sender is not None and "sender" in state:
            self.sender.load_state_dict(state["sender"])
            for j, copy in self.copies.items():
                copy.load_state_dict(state["copies"][j])

    def finish(self) -> None:
        """Consensus: every worker takes the batch-weighted mean of all models."""
        average_models(self.ctx, self.flat.data, self.batch_weight)
