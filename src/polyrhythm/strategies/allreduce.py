"""Synchronous all-reduce SGD with an identical optimizer copy on every worker.

003 Algorithm 1 (all-reduce SGD); the baseline every framework ships (PyTorch DDP, Horovod).
The reduction is the engine's own collective (Gloo's all-reduce) on one flat gradient.
"""

from __future__ import annotations

import torch.distributed as dist

from polyrhythm.optim import FlatSGD, lr_at
from polyrhythm.strategies.base import Strategy


class AllReduceWorker(Strategy):
    """Sum the batch-weighted gradients of all workers, then step the local optimizer copy."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer = FlatSGD(self.flat.data, self.ctx.config)

    def step(self, epoch: int) -> None:
        grad = self.flat.grad().mul_(self.batch_weight)  # weighted: the sum is the global mean
        with self.ctx.spans("allreduce"):
            dist.all_reduce(grad)
        self.optimizer.step(grad, lr_at(self.ctx.config, epoch))
