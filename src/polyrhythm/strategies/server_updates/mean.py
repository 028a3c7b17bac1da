"""MEAN: the update is the batch-weighted mean of the gradients it gathers, at the full
learning rate: for policies whose update holds however many pushes arrived in time (k-BSP
and backup workers, the first k of N; softsync's c stale-scaled gradients), where a sum's
step would shrink with the pushes missing."""

from __future__ import annotations

import torch

from polyrhythm.strategies.server_updates.base import ServerUpdate


class GradientMean(ServerUpdate):
    """The batch-weighted mean of the gathered gradients, one optimizer step."""

    def _gathered(self, weight: float) -> torch.Tensor:
        self.pending.div_(weight)
        return super()._gathered(weight)

    def _share(self, weight: float, share: float) -> float:
        return share / weight
