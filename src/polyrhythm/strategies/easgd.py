"""Asynchronous Elastic Averaging SGD: workers explore, a centre variable on the servers
holds them together.

Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015
(Algorithm 1, asynchronous EASGD). Every tau local steps worker i fetches the centre x~,
moves its elastic difference d = alpha (x_i - x~) out of its own model (x_i <- x_i - d) and
pushes d, which the server adds to the centre (x~ <- x~ + d, ElasticAveragingPolicy). The
final model is the centre.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.messages import FETCH, GRADIENT
from polyrhythm.optim import FlatSGD, lr_at
from polyrhythm.strategies.base import Strategy
from polyrhythm.strategies.ps import ServerLink


class ElasticAveragingWorker(Strategy):
    """Local SGD with momentum on the worker's own gradient; an elastic exchange every tau."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = self.ctx.config
        self.link = ServerLink(self.ctx, len(self.flat), weight=1.0)  # d is added as it is
        self.optimizer = FlatSGD(self.flat.data, config)
        self.centre = torch.empty(len(self.flat))
        self.alpha, self.tau = config.alpha, config.tau
        self.steps = 0

    def step(self, epoch: int) -> None:
        with self.ctx.spans("apply"):
            self.optimizer.step(self.flat.grad(), lr_at(self.ctx.config, epoch))
        self.steps += 1
        if self.steps % self.tau == 0:
            self._exchange()

    def _exchange(self) -> None:
        link = self.link
        with self.ctx.spans("push"):
            link.expect_replies()
            link.send_all(FETCH, self.steps)
            link.wait_sends()
        link.wait_replies(self.centre)
        with self.ctx.spans("apply"):
            elastic = (self.flat.data - self.centre).mul_(self.alpha)
            self.flat.data.sub_(elastic)
        with self.ctx.spans("push"):
            link.send_all(GRADIENT, self.steps, elastic)
            link.wait_sends()

    def finish(self) -> None:
        if self.steps % self.tau:  # the last steps' exploration reaches the centre too
            self._exchange()
        self.link.leave()
