"""TreeEASGD's worker (declared in strategies/decentralised.py): elastic averaging between
the neighbours of a tree, with no server and nobody waiting while training.

The workers form a binary tree (tree_parent, tree_children). Each step a worker first sends
its model to its parent every `tau_up` steps and to its children every `tau_down` steps,
then pulls its model toward each model that has arrived since (w <- w + alpha (w_j - w)), then
takes its local step: the algorithm of the lecture slides, one `Periodic` cadence each way.
Exploration is wider the less often the levels talk. `finish()` sends DONE to every
neighbour, pulls toward every model still in flight until each neighbour's DONE is in, and
the job takes the batch-weighted mean of all models (as D-PSGD's consensus). Where the run
goes on without a lost worker (strategies/peers.py), its neighbours leave it out: the tree is
not re-formed, and the subtree below it trains on apart until that consensus.

A message is one float32 tensor, [kind, w ...], tagged apart from every other traffic.
"""

from __future__ import annotations

import torch

from polyrhythm.strategies.averaging import DecentralisedWorker, average_models
from polyrhythm.strategies.cadence import Periodic
from polyrhythm.strategies.decentralised import elastic_pull, tree_children, tree_parent
from polyrhythm.strategies.peers import PeerMessages

TREE_TAG = 2**24 + 3  # above the bucket ids of PS messages, apart from ring and gossip's
MODEL, DONE = 1.0, 2.0


class TreeElasticWorker(DecentralisedWorker):
    """One node of the tree: its parent's rank (None at the root) and its children's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        topology, index = self.ctx.topology, self.ctx.worker_index
        parent = tree_parent(index)
        self.parent = None if parent is None else topology.worker_ranks[parent]
        self.children = [topology.worker_ranks[c] for c in tree_children(index,
                                                                         topology.workers)]
        self.neighbours = [r for r in (self.parent, *self.children) if r is not None]
        self.up, self.down = Periodic(self.settings.tau_up), Periodic(self.settings.tau_down)
        self.alpha = self.settings.alpha
        self.messages: PeerMessages | None = None
        self.pulls = 0  # models received and pulled toward

    def start(self) -> None:
        self.messages = PeerMessages(self.ctx, self.neighbours, 1 + len(self.flat), TREE_TAG,
                                     is_done=lambda message: message[0] == DONE)

    def step(self, epoch: int) -> None:
        up, down = self.up.step(), self.down.step()
        targets = ([self.parent] if up and self.parent is not None else []) + (
            self.children if down else [])
        with self.ctx.spans("wait"):
            if targets:
                self._send(MODEL, targets)
            while (arrived := self.messages.take(block=False)) is not None:
                self._handle(*arrived)
        self.local_step(epoch)

    def _send(self, kind: float, ranks: list[int]) -> None:
        """Send the model (or DONE) to `ranks`."""
        box = self.messages.compose()
        box[0] = kind
        if kind == MODEL:
            box[1:] = self.flat.data
        self.messages.send(ranks)

    def _handle(self, src: int, message: torch.Tensor) -> None:
        if message[0] == DONE:  # a faster neighbour may be done while this worker trains
            self.messages.done.add(src)
            return
        with self.ctx.spans("apply"):
            self.flat.data.copy_(elastic_pull(self.flat.data, message[1:], self.alpha))
        self.pulls += 1

    def finish(self) -> None:
        with self.ctx.spans("wait"):
            self._send(DONE, self.neighbours)
            while (arrived := self.messages.take(block=True)) is not None:
                self._handle(*arrived)
            self.messages.settle()
        average_models(self.ctx, self.flat.data, self.batch_weight)

    def summary(self) -> dict:
        return {"tree_pulls": self.pulls}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "up": self.up.state_dict(),
                "down": self.down.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.up.load_state_dict(state["up"])
        self.down.load_state_dict(state["down"])
