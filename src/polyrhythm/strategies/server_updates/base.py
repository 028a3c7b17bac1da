"""The server update every rule is: a pending sum of the pushes an update gathers, applied
to a bucket's weights in place."""

from __future__ import annotations

from collections.abc import Callable

import torch

from polyrhythm.optim import Updater


class ServerUpdate:
    """One bucket's update arithmetic (strategies/server_updates/__init__.py): `add` each push
    the policy gathers, `apply` them as one update of `weights` (a view into the bucket's
    outbox: changed in place). `held(worker, weights)` says what a worker now holds (the
    weights it was answered with). `state_dict` holds all it keeps; a checkpoint takes it
    whole with the bucket's.

    Where an update may gather several pushes (`combines`), they add up in float64 and are
    rounded to float32 once: the sum then does not depend on the order the pushes arrive in,
    so a synchronous run is the same whatever the timing (in float32, 3 workers' gradients
    summed in another order moved a 20-step bsp run by 1.6e-5)."""

    # Steps an optimizer (the run's, or a script's); else the update moves the weights itself.
    steps_optimizer = True
    # A push alone in its update, of weight and scale 1 (a single worker's), may be the update
    # itself, unsummed (see `add`).
    takes_alone = True

    def __init__(self, weights: torch.Tensor, settings, workers: int, *, combines: bool,
                 make_optimizer: Callable[[], Updater]) -> None:
        self.weights = weights
        self.optimizer = make_optimizer() if self.steps_optimizer else None
        wide = torch.float64 if combines else torch.float32
        self.pending = torch.zeros_like(weights, dtype=wide)
        self.update = torch.empty_like(weights) if combines else self.pending
        self.alone: torch.Tensor | None = None  # a push that is the update by itself

    def add(self, grad: torch.Tensor, weight: float, scale: float, worker: int,
            alone: bool) -> None:
        """Gather `worker`'s push `grad` with its batch weight; `scale` shrinks its step, not
        its weight. `alone`: it is by itself in an update applied before `grad` is written
        again, with weight and scale 1: taken as the update itself, since the pending sum
        would hold exactly its values after three passes over them on the step's critical
        path (add, copy, zero)."""
        if alone and self.takes_alone:
            self.alone = grad
        else:
            self.pending.add_(grad, alpha=weight * scale)

    def apply(self, lr: float, hyper: list[float] | None, weight: float,
              share: float) -> None:
        """Apply what was gathered as one update: `weight`, its pushes' batch weights' sum,
        `share` the sum of weight x scale (global batches' worth of step); `lr`, the rate to
        step at, and `hyper`, a script's optimizer's settings as its last push carried them
        (None: the run's)."""
        update, self.alone = self.alone, None
        if update is None:
            update = self._gathered(weight)
        self._move(update, lr, hyper, weight, share)
        if update is self.update:
            self.pending.zero_()

    def _gathered(self, weight: float) -> torch.Tensor:
        """The pending pushes as the update (rounded to float32 where they summed wide)."""
        if self.update is not self.pending:
            self.update.copy_(self.pending)
        return self.update

    def _move(self, update: torch.Tensor, lr: float, hyper: list[float] | None,
              weight: float, share: float) -> None:
        """Step the optimizer by the update. One whose step is not linear in the gradient
        (Adam: the gradient's scale cancels out) gets the mean gradient, and its learning
        rate is scaled by the share of a global batch the update is (an asynchronous push's
        batch share, a staleness-aware scale), as a linear one's step is by the gradient."""
        scale = 1.0
        if not self.optimizer.linear and weight > 0:
            share = self._share(weight, share)
            if share > 0 and share != 1:
                update.div_(share)
                scale = share
        if hyper is not None:  # a script's optimizer, at the settings its push carried
            self.optimizer.follow(hyper, scale)
            self.optimizer.step(update, None)
        else:
            self.optimizer.step(update, lr * scale)

    def _share(self, weight: float, share: float) -> float:
        """The share of a global batch the update is (see _move)."""
        return share

    def held(self, worker: int, weights: torch.Tensor) -> None:  # noqa: B027 - optional
        """`worker` was answered with `weights`: its next gradient is computed on them."""

    def take_over(self, optimizer: dict | None) -> None:
        """Start from another layout's state (the bucket's weights are taken over already):
        its optimizer's flat state for this slice (None: a fresh one)."""
        if self.optimizer is not None and optimizer is not None:
            self.optimizer.load_state_dict(optimizer)

    def state_dict(self) -> dict:
        return {"pending": self.pending.clone(),
                "optimizer": self.optimizer.state_dict() if self.optimizer else None}

    def load_state_dict(self, state: dict) -> None:
        self.pending.copy_(state["pending"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
