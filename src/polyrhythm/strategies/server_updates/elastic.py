"""ELASTIC: asynchronous EASGD's centre variable (Zhang, Choromanska and LeCun, "Deep learning
with Elastic Averaging SGD", NIPS 2015). A push is a worker's elastic difference
alpha (x_i - x~), not a gradient: the centre adds it (x~ <- x~ + alpha (x_i - x~)), with no
optimizer."""

from __future__ import annotations

import torch

from polyrhythm.strategies.server_updates.base import ServerUpdate


class ElasticCentre(ServerUpdate):
    """The centre x~: each update adds the gathered elastic differences."""

    steps_optimizer = False
    takes_alone = False

    def _move(self, update: torch.Tensor, lr: float, hyper: list[float] | None,
              weight: float, share: float) -> None:
        self.weights.add_(update)
