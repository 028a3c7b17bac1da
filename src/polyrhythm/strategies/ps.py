"""Worker side of the parameter-server family (BSP, ASP, SSP, ...): push, then pull.

The consistency model lives entirely on the servers (strategies/consistency.py). The model is
split into buckets, each owned by one server. During backward, a hook pushes each bucket's
gradient the moment every parameter in it has one (the last layers first), so pushes, server
updates and replies overlap the rest of backward, as in DDP's bucketing or BytePS. After
backward the worker pushes whatever is left and waits for every bucket's reply: how long it
waits is the policy's decision.
"""

from __future__ import annotations

from functools import partial

import torch

from polyrhythm.comm.messages import DONE, PUSH, PUSH_HEADER, REPLY_HEADER
from polyrhythm.flat import BucketLayout
from polyrhythm.strategies.base import Strategy


class ParameterServerWorker(Strategy):
    """Push gradient buckets to their servers as backward produces them; pull them back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        topology, flat = self.ctx.topology, self.flat
        layout = BucketLayout(len(flat), topology.servers, self.ctx.config.bucket_kb)
        self.buckets = layout.buckets  # (server, start, stop) by bucket id
        capacity = [layout.capacity(s) for s in range(topology.servers)]
        self.outbox = [torch.zeros(PUSH_HEADER + capacity[s]) for s, _, _ in self.buckets]
        self.inbox = [torch.empty(REPLY_HEADER + b - a) for _, a, b in self.buckets]
        self.pulled = [0] * len(self.buckets)  # server version each bucket was pulled at
        self.clock = 0
        self.grad = torch.zeros(len(flat))
        # Which buckets each parameter feeds, and how many parameters each bucket waits for.
        self.feeds = [[k for k, (_, a, b) in enumerate(self.buckets) if a < stop and start < b]
                      for start, stop in flat.ranges]
        self.needs = [sum(k in f for f in self.feeds) for k in range(len(self.buckets))]
        self.missing: list[int] = []
        self.sends: list = []
        self.receives: list = []
        for i, p in enumerate(flat.params):
            p.register_post_accumulate_grad_hook(partial(self._on_grad, i))

    def begin_step(self, epoch: int) -> None:
        self.clock += 1
        self.grad.zero_()  # a parameter without a gradient this step pushes zeros
        self.missing = list(self.needs)
        self.sends = [None] * len(self.buckets)
        # Post every receive first, so a reply never waits for a matching receive.
        server_ranks = self.ctx.topology.server_ranks
        self.receives = [self.ctx.transport.irecv(box, server_ranks[s], tag=k)
                         for k, (box, (s, _, _)) in enumerate(
                             zip(self.inbox, self.buckets, strict=True))]

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        if not self.missing:
            return  # a backward outside a training step (not ours to push)
        start, stop = self.flat.ranges[index]
        self.grad[start:stop] = param.grad.reshape(-1)
        for k in self.feeds[index]:
            self.missing[k] -= 1
            if self.missing[k] == 0:
                self._push(k, PUSH)

    def _push(self, k: int, kind: float) -> None:
        server, a, b = self.buckets[k]
        box = self.outbox[k]
        box[:PUSH_HEADER] = torch.tensor([kind, self.clock, self.pulled[k], self.batch_weight, k])
        box[PUSH_HEADER:PUSH_HEADER + b - a] = self.grad[a:b]
        self.sends[k] = self.ctx.transport.isend(box, self.ctx.topology.server_ranks[server])

    def step(self, epoch: int) -> None:
        with self.ctx.spans("push"):
            for k, work in enumerate(self.sends):
                if work is None:  # parameters that got no gradient
                    self._push(k, PUSH)
            for work in self.sends:
                work.wait()
        with self.ctx.spans("pull"):
            for work in self.receives:
                work.wait()
        self.missing = []
        for k, (_, a, b) in enumerate(self.buckets):
            self.pulled[k] = int(self.inbox[k][0])
            self.flat.data[a:b] = self.inbox[k][REPLY_HEADER:]

    def finish(self) -> None:
        for k in range(len(self.buckets)):
            self._push(k, DONE)
        for work in self.sends:
            work.wait()
