"""Asynchronous Elastic Averaging SGD: workers explore, a centre variable on the servers
holds them together.

Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015
(Algorithm 1, asynchronous EASGD). Every tau local steps worker i fetches the centre x~,
moves its elastic difference d = alpha (x_i - x~) out of its own model (x_i <- x_i - d) and
pushes d, which the server adds to the centre (x~ <- x~ + d, server_updates/elastic.py). The
final model is the centre.
"""

from __future__ import annotations

import torch

from polyrhythm.optim import lr_at
from polyrhythm.strategies.base import Strategy
from polyrhythm.strategies.cadence import Periodic
from polyrhythm.strategies.ps_worker import ServerLink
from polyrhythm.strategies.serving import FETCH, GRADIENT


class ElasticAveragingWorker(Strategy):
    """Local SGD with momentum on the worker's own gradient; an elastic exchange every tau."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.link = ServerLink(self.ctx, self.flat, weight=1.0)  # d is added as it is
        self.optimizer = self.local_optimizer()
        self.centre = torch.empty(len(self.flat))
        self.alpha = self.settings.alpha
        self.cadence = Periodic(self.settings.tau)

    def step(self, epoch: int) -> None:
        with self.ctx.spans("apply"):
            self.optimizer.step(self.flat.grad(), lr_at(self.ctx.config.optimizer, epoch))
        if self.cadence.step():
            self._exchange()

    def _exchange(self) -> None:
        link, steps = self.link, self.cadence.steps
        with self.ctx.spans("push"):
            link.expect_replies()
            link.send_all(FETCH, steps)
            link.wait_sends()
        link.wait_replies(self.centre)
        with self.ctx.spans("apply"):
            elastic = (self.flat.data - self.centre).mul_(self.alpha)
            self.flat.data.sub_(elastic)
        with self.ctx.spans("push"):
            link.send_all(GRADIENT, steps, elastic)
            link.wait_sends()

    def finish(self) -> None:
        if self.cadence.owed:  # the last steps' exploration reaches the centre too
            self._exchange()
        self.link.leave()

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "cadence": self.cadence.state_dict(),
                "link": self.link.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.cadence.load_state_dict(state["cadence"])
        self.link.load_state_dict(state["link"])
