"""The optimizer every strategy shares: SGD with momentum, weight decay and step lr decay."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_sgd(params: Iterable[torch.Tensor], config) -> torch.optim.SGD:
    """SGD as the config describes it; servers and all-reduce workers build the same one."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


def lr_at(config, epoch: int) -> float:
    """Step decay: lr x lr_decay^(epoch // lr_decay_every)."""
    if config.lr_decay_every <= 0:
        return config.lr
    return config.lr * config.lr_decay ** (epoch // config.lr_decay_every)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
