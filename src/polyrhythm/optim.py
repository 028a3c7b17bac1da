"""The optimizer every strategy shares: SGD with momentum, weight decay and step lr decay.

`optimizer` below is the run's [optimizer] settings (lr, momentum, weight_decay, ...)."""

from __future__ import annotations

import torch


def effective_momentum(optimizer, concurrency: float = 1.0) -> float:
    """The explicit momentum an optimizer should use.

    Asynchrony itself acts as momentum of about 1 - 1/C with C updates in flight (C = N
    workers for asynchronous servers; Mitliagkas et al.,
    "Asynchrony begets momentum, with an application to deep learning", 2016), so stacking the
    full explicit momentum on top makes asynchronous SGD unstable (mnist5k, 4 ASP workers,
    momentum 0.9: diverged in some runs). With `async_momentum_correction`, asynchronous
    servers subtract the implicit part.
    """
    if not optimizer.async_momentum_correction:
        return optimizer.momentum
    return max(0.0, optimizer.momentum - (1.0 - 1.0 / concurrency))


def lr_at(optimizer, epoch: int) -> float:
    """Step decay: lr x lr_decay^(epoch // lr_decay_every)."""
    if optimizer.lr_decay_every <= 0:
        return optimizer.lr
    return optimizer.lr * optimizer.lr_decay ** (epoch // optimizer.lr_decay_every)


class FlatSGD:
    """torch.optim.SGD's update (momentum, weight decay, no dampening or Nesterov) on one flat
    tensor, without the per-call overhead of an Optimizer: servers step many small buckets."""

    def __init__(self, weights: torch.Tensor, optimizer, concurrency: float = 1.0) -> None:
        self.weights = weights
        self.momentum = effective_momentum(optimizer, concurrency)
        self.weight_decay = optimizer.weight_decay
        self.buffer = torch.zeros_like(weights) if self.momentum else None

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float) -> None:
        d = grad.add(self.weights, alpha=self.weight_decay) if self.weight_decay else grad
        if self.buffer is not None:
            # torch starts the buffer as a copy of d; 0 * momentum + d is exactly that.
            d = self.buffer.mul_(self.momentum).add_(d)
        self.weights.add_(d, alpha=-lr)

    def state_dict(self) -> dict:
        """A copy of the momentum buffer (the weights belong to whoever owns them); None
        without momentum."""
        return {"momentum_buffer": None if self.buffer is None else self.buffer.clone()}

    def load_state_dict(self, state: dict) -> None:
        """A buffer saved without momentum (None) starts from zero, as torch's SGD does."""
        saved = state["momentum_buffer"]
        if self.buffer is None:
            return
        if saved is None:
            self.buffer.zero_()
        else:
            self.buffer.copy_(saved)
