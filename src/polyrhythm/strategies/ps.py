"""Worker side of the parameter-server family (BSP, ASP, SSP, ...): push, then pull.

The consistency model lives entirely on the servers (strategies/consistency.py); a worker
pushes its weighted gradient slice to each server and blocks until each answers with its new
slice. How long it blocks is the policy's decision.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.messages import DONE, PUSH, PUSH_HEADER, REPLY_HEADER
from polyrhythm.flat import shard_ranges
from polyrhythm.strategies.base import Strategy


class ParameterServerWorker(Strategy):
    """Push the gradient slice j to server j, then pull parameter slice j from it."""

    uses_servers = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ranges = shard_ranges(len(self.flat), self.ctx.topology.servers)
        self.outbox = [torch.empty(PUSH_HEADER + b - a) for a, b in self.ranges]
        self.inbox = [torch.empty(REPLY_HEADER + b - a) for a, b in self.ranges]
        self.pulled = [0] * len(self.ranges)  # server version each slice was pulled at
        self.clock = 0

    def step(self, epoch: int) -> None:
        grad = self.flat.grad()  # the server weights it by batch_weight, sent in the header
        self.clock += 1
        for j, (a, b) in enumerate(self.ranges):
            self.outbox[j][:PUSH_HEADER] = torch.tensor(
                [PUSH, self.clock, self.pulled[j], self.batch_weight])
            self.outbox[j][PUSH_HEADER:] = grad[a:b]
        self._exchange()
        for j, (a, b) in enumerate(self.ranges):
            self.pulled[j] = int(self.inbox[j][0])
            self.flat.data[a:b] = self.inbox[j][REPLY_HEADER:]

    def _exchange(self) -> None:
        transport, servers = self.ctx.transport, self.ctx.topology.server_ranks
        with self.ctx.spans("push"):
            # Post every receive first, so no server's reply waits on our other sends.
            receives = [transport.irecv(box, s)
                        for box, s in zip(self.inbox, servers, strict=True)]
            sends = [transport.isend(box, s) for box, s in zip(self.outbox, servers, strict=True)]
            for work in sends:
                work.wait()
        with self.ctx.spans("pull"):
            for work in receives:
                work.wait()

    def finish(self) -> None:
        for j, server in enumerate(self.ctx.topology.server_ranks):
            self.outbox[j][0] = DONE
            self.ctx.transport.isend(self.outbox[j], server).wait()
