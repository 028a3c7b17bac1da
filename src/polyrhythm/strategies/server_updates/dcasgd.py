"""DELAY_COMPENSATED: DC-ASGD (Zheng et al., "Asynchronous Stochastic Gradient Descent with
Delay Compensation", ICML 2017), with a constant lambda (the paper's DC-ASGD-c).

A worker's gradient g was computed on the weights w_bak it was last answered with; by the
time it arrives, other workers' updates have moved the server's weights to w. The server
takes the first-order Taylor correction of g towards w, with the outer product of the
gradient standing in for the Hessian's diagonal:

    g~ = g + lambda * g * g * (w - w_bak)    (element-wise)

and steps by g~ as asp steps by g (SUM's step). It keeps a copy of the weights each worker
was last answered with (N copies of the bucket). lambda = 0 is asp exactly."""

from __future__ import annotations

from collections.abc import Callable

import torch

from polyrhythm.optim import Updater
from polyrhythm.strategies.server_updates.base import ServerUpdate


def compensated(grad: torch.Tensor, weights: torch.Tensor, backup: torch.Tensor,
                lam: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """g + lambda * g * g * (w - w_bak), into `out` (a new tensor if None)."""
    out = torch.sub(weights, backup, out=out)
    return out.mul_(grad).mul_(grad).mul_(lam).add_(grad)


class DelayCompensated(ServerUpdate):
    """Each push compensated for the updates made since its worker's pull, then stepped."""

    def __init__(self, weights: torch.Tensor, settings, workers: int, *, combines: bool,
                 make_optimizer: Callable[[], Updater]) -> None:
        super().__init__(weights, settings, workers, combines=combines,
                         make_optimizer=make_optimizer)
        self.lam = float(settings.dc_lambda)
        # Every worker starts from the weights the bucket starts with.
        self.backups = weights.clone().expand(workers, -1).contiguous()
        self.compensated = torch.empty_like(weights)

    def add(self, grad: torch.Tensor, weight: float, scale: float, worker: int,
            alone: bool) -> None:
        value = compensated(grad, self.weights, self.backups[worker], self.lam,
                            out=self.compensated)
        super().add(value, weight, scale, worker, alone)

    def held(self, worker: int, weights: torch.Tensor) -> None:
        self.backups[worker].copy_(weights)

    def take_over(self, optimizer: dict | None) -> None:
        """Every worker holds the weights taken over (a handover's, a checkpoint's)."""
        super().take_over(optimizer)
        self.backups.copy_(self.weights.expand_as(self.backups))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "backups": self.backups.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.backups.copy_(state["backups"])
