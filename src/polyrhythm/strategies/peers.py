"""Messages between a worker and its peers that need no answer (gossip's, TreeEASGD's): sent
without waiting for the peer, received in arrival order by a Receiver, each peer's ending with
its DONE. Where the workers may change (on_worker_failure = continue: comm/membership.py), a
peer gone or silent is left out: nobody sends to it or waits for its DONE any more; else its
loss ends the run, as every fault does."""

from __future__ import annotations

from collections.abc import Callable

import torch

from polyrhythm.comm.transport import PeerFault, Pending
from polyrhythm.context import RankContext


class PeerMessages:
    """A worker's messages of `numel` float32 values with the peers `ranks`, on `tag`;
    `is_done(message)`: a peer's last.

    A message is written into the one outbox `compose()` gives, then `send()`: compose
    waits for the last message's sends first, as Gloo reads the outbox while it sends (a
    DONE written over a model still on its way reached the peer as that model: its
    receives ended there, and the real DONE waited for ever)."""

    def __init__(self, ctx: RankContext, ranks: list[int], numel: int, tag: int,
                 is_done: Callable[[torch.Tensor], bool]) -> None:
        self.ctx, self.ranks, self.tag = ctx, list(ranks), tag
        self.done: set[int] = set()  # peers whose DONE is in
        self.gone: set[int] = set()  # peers left out
        self.goes_on = ctx.transport.membership is not None
        # A wait that keeps its own time and ends when the peer is seen gone, where the run
        # goes on without it: a send being written as its peer died is left neither done nor
        # failed by Gloo, whose own timeout would then hold this worker for --timeout (and
        # close every connection it has), its peers calling it lost meanwhile.
        self.within = ctx.config.timeout if self.goes_on else None
        self.inbox = (ctx.transport.receiver(self.ranks, numel, tag, last=is_done)
                      if self.ranks else None)
        self._outbox = torch.empty(numel)
        self._given_up: list[torch.Tensor] = []  # outboxes of sends given up on (settle)
        self._sends: list[Pending] = []

    def take(self, block: bool) -> tuple[int, torch.Tensor] | None:
        """The next message as (rank, message); None if none is in and not `block`, or once
        every peer is done or gone."""
        while self.inbox is not None and not (block and self.finished):
            try:
                return self.inbox.take(block=block)
            except PeerFault as fault:
                self.lose(fault)
                if not block:
                    return None
        return None

    @property
    def finished(self) -> bool:
        """Every peer's DONE is in, or it is gone."""
        return len(self.done | self.gone) >= len(self.ranks)

    def compose(self) -> torch.Tensor:
        """The outbox to write the next message into, once the last one's sends are done
        (each peer's receive is always posted: this is short)."""
        self.settle()
        return self._outbox

    def send(self, ranks: list[int]) -> list[int]:
        """Send the message composed to those of `ranks` not gone; the ranks it left for."""
        sent = []
        for rank in ranks:
            if rank in self.gone:
                continue
            try:
                self._sends.append(self.ctx.transport.isend(self._outbox, rank, self.tag))
                sent.append(rank)
            except PeerFault as fault:  # its connection broke already
                self.lose(fault)
        return sent

    def settle(self) -> None:
        """The sends made are done (a peer that went meanwhile is left out)."""
        for work in self._sends:
            try:
                work.wait(self.within)
            except PeerFault as fault:
                self.lose(fault)
                # A send given up on may still be read by Gloo (a live peer fallen silent):
                # the next message goes in a fresh outbox, the old one kept for it.
                self._given_up.append(self._outbox)
                self._outbox = torch.empty_like(self._outbox)
        self._sends = []

    def lose(self, fault: PeerFault) -> None:
        """A peer gone or silent: left out where the run goes on without it, else the end."""
        if not self.goes_on or fault.rank is None:
            raise fault
        self.gone.add(fault.rank)
