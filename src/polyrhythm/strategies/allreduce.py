"""Synchronous all-reduce SGD with an identical optimizer copy on every worker.

Algorithm 1 (all-reduce SGD) of Nam's parameter-server lectures; the baseline every framework
ships (PyTorch DDP, Horovod).
The reduction is the engine's own collective (Gloo's all-reduce) or one of polyrhythm's
schedules over point-to-point messages (comm/collectives.py): ring, tree, reduce-broadcast.
"""

from __future__ import annotations

from polyrhythm.comm.transport import NATIVE, WORKERS
from polyrhythm.optim import lr_at
from polyrhythm.strategies.base import Strategy


class AllReduceWorker(Strategy):
    """Sum the batch-weighted gradients of all workers, then step the local optimizer copy."""

    def __init__(self, *args, algorithm: str = NATIVE, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer = self.local_optimizer()
        self.algorithm = algorithm

    def step(self, epoch: int) -> None:
        with self.ctx.spans("push"):  # weighted: the sum is the global mean
            grad = self.flat.grad().mul_(self.batch_weight)
        # A collective sends, waits and receives at once: it all counts as waiting for peers.
        with self.ctx.spans("wait"):
            self.ctx.transport.all_reduce(grad, WORKERS, self.algorithm)
        with self.ctx.spans("apply"):
            self.optimizer.step(grad, lr_at(self.ctx.config.optimizer, epoch))

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
