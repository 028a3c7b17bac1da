"""The optimizer every strategy shares: SGD with momentum, weight decay and step lr decay."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_sgd(params: Iterable[torch.Tensor], config, asynchronous: bool = False
             ) -> torch.optim.SGD:
    """SGD as the config describes it; servers and all-reduce workers build the same one."""
    return torch.optim.SGD(params, lr=config.lr, momentum=effective_momentum(config, asynchronous),
                           weight_decay=config.weight_decay)


def effective_momentum(config, asynchronous: bool) -> float:
    """The explicit momentum an optimizer should use.

    Asynchrony itself acts as momentum of about 1 - 1/N with N workers (Mitliagkas et al.,
    "Asynchrony begets momentum, with an application to deep learning", 2016), so stacking the
    full explicit momentum on top makes asynchronous SGD unstable (mnist5k, 4 ASP workers,
    momentum 0.9: diverged in some runs). With `async_momentum_correction`, asynchronous
    servers subtract the implicit part.
    """
    if not asynchronous or not config.async_momentum_correction:
        return config.momentum
    return max(0.0, config.momentum - (1.0 - 1.0 / config.workers))


def lr_at(config, epoch: int) -> float:
    """Step decay: lr x lr_decay^(epoch // lr_decay_every)."""
    if config.lr_decay_every <= 0:
        return config.lr
    return config.lr * config.lr_decay ** (epoch // config.lr_decay_every)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
