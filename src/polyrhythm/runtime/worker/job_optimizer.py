"""The optimizer a script gets back from `job.wrap`: a thin `torch.optim.Optimizer` whose
param groups and state are the script's own optimizer's (as Accelerate's
AcceleratedOptimizer and torchft's OptimizerWrapper wrap one), and whose `step()` is the
job's step. Nothing of the script's optimizer, of torch or of the process is patched: a
scheduler, a clip or a `state_dict` reads the same groups and state through either object.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from polyrhythm.errors import ConfigError


class JobOptimizer(torch.optim.Optimizer):
    """`optimizer` as the job steps it: `step()` runs `exchange` (the strategy's step). The
    script's optimizer steps by its own `step` (`step_own`), where the workers step it
    (all-reduce, the averaging strategies, a run alone); where the servers step the model,
    its own `step` still runs once, with no gradient to apply (every torch optimizer passes
    over a parameter without one), so that what tracks its steps sees each of them: a
    scheduler made before `job.wrap`, the script's step hooks."""

    # Optimizer.__init__ is not called on purpose: groups, state and defaults are the
    # wrapped optimizer's (the properties below), not copies that could part from them.
    def __init__(self, optimizer: torch.optim.Optimizer, exchange: Callable[[], None]) -> None:
        self.optimizer = optimizer
        self._exchange = exchange
        self.inside = False  # within step(): the wrapped optimizer's own step is the job's
        self.own_steps = 0  # how often the wrapped optimizer applied a gradient

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def __getattr__(self, name: str):
        # What this class does not define is the wrapped optimizer's (its step hooks among
        # them: registered here, they run when it steps).
        if name == "optimizer":  # not set yet: unpickling, copying
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"JobOptimizer({self.optimizer!r})"

    def step(self, closure=None) -> None:
        """The job's step: this worker's gradients through the strategy; the model holds
        the next parameters when it returns."""
        if closure is not None:
            raise ConfigError("a wrapped optimizer's step takes no closure (LBFGS-style "
                              "optimizers re-evaluate the loss, which no strategy can share)")
        self.inside = True
        try:
            applied = self.own_steps
            self._exchange()
            if self.own_steps == applied:
                self._step_without_gradients()
        finally:
            self.inside = False

    def step_own(self) -> None:
        """The wrapped optimizer's own step on the gradients in its parameters (the workers'
        update where they step it)."""
        self.own_steps += 1
        self.optimizer.step()

    def _step_without_gradients(self) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            self.optimizer.step()
        finally:
            for p, grad in zip(params, grads, strict=True):
                p.grad = grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)


def guard_steps(wrapped: Callable[[], JobOptimizer | None]):
    """An optimizer step pre-hook for every optimizer of a job's process (torch's public
    register_optimizer_step_pre_hook): an optimizer the script steps other than through
    `job.wrap`'s would train this worker alone, unseen by the strategy, so it is one line.
    `wrapped()`: the job's JobOptimizer (None before job.wrap), or False once the job is
    gone."""
    def hook(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        job_optimizer = wrapped()
        if job_optimizer is False or getattr(optimizer, "polyrhythm_internal", False):
            return  # no job any more; the run's own optimizers
        if job_optimizer is not None and optimizer is job_optimizer.optimizer:
            if job_optimizer.inside:
                return
            raise ConfigError(f"the script stepped the {type(optimizer).__name__} it gave "
                              "job.wrap, not the optimizer job.wrap returned: write model, "
                              "opt = job.wrap(model, opt) and step that opt")
        raise ConfigError(f"an optimizer ({type(optimizer).__name__}) was stepped without "
                          "job.wrap: in a polyrhythm job write model, opt = job.wrap(model, "
                          "opt) and step that")
    return hook
