"""Synchronous all-reduce SGD with an identical optimizer copy on every worker.

Algorithm 1 (all-reduce SGD) of Nam's parameter-server lectures; the baseline every framework
ships (PyTorch DDP, Horovod).
The reduction is the engine's own collective (Gloo's all-reduce) or one of polyrhythm's
schedules over point-to-point messages (comm/collectives.py): ring, tree, reduce-broadcast.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.compressed import CompressedAllReduce
from polyrhythm.comm.transport import NATIVE, WORKERS
from polyrhythm.compression.buckets import compressing
from polyrhythm.flat import FlatParameters
from polyrhythm.optim import lr_at
from polyrhythm.strategies.base import Strategy


def gradient_sum(strategy: Strategy, algorithm: str = NATIVE) -> CompressedAllReduce | None:
    """A strategy's compressed all-reduce of its flat model's size over the workers, or None
    where the run compresses nothing."""
    ctx, flat = strategy.ctx, strategy.flat
    if not compressing(ctx.config.compression):
        return None
    return CompressedAllReduce(ctx.transport, ctx.config.compression, flat.shapes, len(flat),
                               strategy.batch_weight, ctx.worker_index, ctx.config.seed,
                               ctx.spans, WORKERS, algorithm)


class AllReduceWorker(Strategy):
    """Sum the batch-weighted gradients of all workers, then step the local optimizer copy.
    Under compression the sum travels compressed (comm/compressed.py)."""

    def __init__(self, *args, algorithm: str = NATIVE, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer = self.local_optimizer()
        self.algorithm = algorithm
        self.compressed = gradient_sum(self, algorithm)

    reduced: torch.Tensor | None = None  # this step's mean gradient, if summed before it

    @property
    def workers_agree(self) -> bool:
        return True

    def reduce_gradients(self) -> None:
        self.reduced = self._sum()
        into_model(self.flat, self.reduced)

    def _sum(self) -> torch.Tensor:
        """The workers' mean gradient (their batch-weighted sum)."""
        with self.ctx.spans("push"):  # weighted: the sum is the global mean
            grad = self.flat.grad().mul_(self.batch_weight)
        if self.compressed is not None:
            self.compressed(grad)
        else:
            # A collective sends, waits and receives at once: it all counts as waiting.
            with self.ctx.spans("wait"):
                self.ctx.transport.all_reduce(grad, WORKERS, self.algorithm)
        return grad

    def step(self, epoch: int) -> None:
        # Summed already (reduce_gradients): the model's gradients are views of it, clipped
        # in place since.
        grad, self.reduced = self.reduced, None
        if grad is None:
            grad = self._sum()
        with self.ctx.spans("apply"):
            self.optimizer.step(grad, lr_at(self.ctx.config.optimizer, epoch))

    def summary(self) -> dict:
        """Where the workers may change, Gloo's own all-reduce cannot be theirs: the run says
        its sums travelled by the ring (comm/membership.py) instead."""
        if self.algorithm == NATIVE and self.ctx.transport.membership is not None:
            return {"sums_by": "ring"}
        return {}

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict()}
        if self.compressed is not None:
            state["compressed"] = self.compressed.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.compressed is not None and "compressed" in state:
            self.compressed.load_state_dict(state["compressed"])


def into_model(flat: FlatParameters, grad: torch.Tensor) -> None:
    """Each trained parameter's gradient becomes its part of the flat `grad` (a view: what
    changes it in place, a clip, changes `grad`)."""
    for p, (a, b) in zip(flat.params, flat.ranges, strict=True):
        p.grad = grad[a:b].view_as(p)
