"""GoSGD's worker (declared in strategies/decentralised.py): after each local step, merge the
models that have arrived, and now and then send the model and half its weight to a random
peer (Blot et al. 2016)."""

from __future__ import annotations

import torch

from polyrhythm.comm.transport import WORKERS
from polyrhythm.compression.buckets import codec, compressing
from polyrhythm.compression.feedback import ChangeSender, Copy
from polyrhythm.compression.wire import codec_seed
from polyrhythm.strategies.averaging import GOSSIP_TAG, DecentralisedWorker, average_models
from polyrhythm.strategies.cadence import GossipCoin
from polyrhythm.strategies.decentralised import gossip_merge, gossip_send_share
from polyrhythm.strategies.peers import PeerMessages

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

    Under compression a model travels as its change since the copy of it the peer holds
    (kept by the sender, per peer), and the peer merges its copy.

    With on_worker_failure = continue a peer gone (or silent past the timeout) is left out:
    nobody sends to it or waits for its DONE any more, and a share of alpha that could not
    leave stays with its sender; what the lost peer held is lost with it, and the consensus
    divides by the alphas left.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.ctx
        self.alpha = 1.0 / ctx.topology.workers
        self.peers = [r for r in ctx.topology.worker_ranks if r != ctx.rank]
        self.cadence = GossipCoin(self.settings.gossip_p, len(self.peers), ctx.config.seed,
                                  ctx.worker_index)
        self.senders: dict[int, ChangeSender] = {}  # by peer rank: what it holds of mine
        self.copies: dict[int, Copy] = {}  # by peer rank: what I hold of its model
        settings, n = ctx.config.compression, len(self.flat)
        if compressing(settings):
            def made(rank: int) -> object:
                return codec(settings, 0, n, self.flat.shapes,
                             codec_seed(ctx.config.seed, GOSSIP_TAG, ctx.rank, rank))
            self.senders = {r: ChangeSender(made(r), self.flat.data) for r in self.peers}
            self.copies = {r: Copy(made(r), self.flat.data) for r in self.peers}
        words = next(iter(self.senders.values())).codec.words if self.senders else n
        self.width = GOSSIP_HEADER + words  # a message's float32 values
        self.messages: PeerMessages | None = None

    def consensus_weight(self) -> float:
        return self.alpha

    def start(self) -> None:
        self.messages = PeerMessages(self.ctx, self.peers, self.width, GOSSIP_TAG,
                                     is_done=lambda message: message[0] == DONE)

    def step(self, epoch: int) -> None:
        self.local_step(epoch)
        with self.ctx.spans("wait"):
            while (arrived := self.messages.take(block=False)) is not None:
                self._handle(*arrived)
            peer = self.cadence.step()
            if peer is not None and self.peers[peer] not in self.messages.gone:
                self._send(self.peers[peer])

    def _handle(self, src: int, message: torch.Tensor) -> None:
        kind, alpha, w = decode_gossip(message)
        if kind == DONE:  # a faster peer may be done while this worker still trains
            self.messages.done.add(src)
            return
        if self.copies:
            with self.ctx.spans("compress"):
                w = self.copies[src].apply(w)
        merged, self.alpha = gossip_merge(self.flat.data, self.alpha, w, alpha)
        self.flat.data.copy_(merged)

    def _send(self, rank: int) -> None:
        box = self.messages.compose()
        self.alpha, share = gossip_send_share(self.alpha)
        if self.senders:
            encode_gossip(box, MODEL, share)
            with self.ctx.spans("compress"):
                self.senders[rank].encode(self.flat.data, box[GOSSIP_HEADER:])
        else:
            encode_gossip(box, MODEL, share, self.flat.data)
        if not self.messages.send([rank]):  # never left: its share stays here
            self.alpha += share

    def finish(self) -> None:
        with self.ctx.spans("wait"):
            # A DONE follows this worker's last model to each peer (messages between two
            # ranks keep their order); each peer's receive thread waits for it. It is as
            # long as a model message, the size of the receives posted for it.
            encode_gossip(self.messages.compose(), DONE, 0.0)
            self.messages.send(self.peers)
            while (arrived := self.messages.take(block=True)) is not None:
                self._handle(*arrived)
            self.messages.settle()
        # Consensus: the alpha-weighted mean. Messages in flight have all been merged, so the
        # alphas sum to 1 up to float64 rounding, which dividing by their sum removes (and
        # where a worker was lost, what it held).
        total = torch.tensor([self.alpha], dtype=torch.float64)
        with self.ctx.spans("wait"):
            self.ctx.transport.all_reduce(total, WORKERS)
        average_models(self.ctx, self.flat.data, self.alpha / total.item())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "alpha": self.alpha,
                "cadence": self.cadence.state_dict(),
                "senders": {r: s.state_dict() for r, s in self.senders.items()},
                "copies": {r: c.state_dict() for r, c in self.copies.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.alpha = state["alpha"]
        self.cadence.load_state_dict(state["cadence"])
        for rank, sender in self.senders.items():
            sender.load_state_dict(state["senders"][rank])
        for rank, copy in self.copies.items():
            copy.load_state_dict(state["copies"][rank])
