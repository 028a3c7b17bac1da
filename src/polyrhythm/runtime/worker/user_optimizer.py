"""A user's torch.optim optimizer inside a job: as the Updater the workers step themselves
(all-reduce, local SGD, ...), and as the OptimizerSpec the parameter servers rebuild on their
slices of the flat model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from polyrhythm.errors import ConfigError
from polyrhythm.flat import FlatParameters
from polyrhythm.optim import ELEMENTWISE, OptimizerSpec, StateKeys, joined, kept_state

# Entries of a param group that are not hyperparameters, or that torch adds itself (a
# scheduler's initial_lr).
_NOT_HYPER = {"params", "initial_lr", "name"}


class UserOptimizer:
    """The user's optimizer as an optim.Updater on the flat model: `step` hands it the
    update as its parameters' gradients and runs its own step (`step_own`: the job's
    JobOptimizer.step_own), at its own rates (its scheduler's): the `lr` argument is the
    run's schedule, which a user's optimizer does not follow."""

    def __init__(self, optimizer: torch.optim.Optimizer, flat: FlatParameters,
                 step_own: Callable[[], None]) -> None:
        self.optimizer, self.flat, self.step_own = optimizer, flat, step_own
        self.weights = flat.data
        self.linear = type(optimizer) is torch.optim.SGD

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float) -> None:
        for p, (a, b) in zip(self.flat.params, self.flat.ranges, strict=True):
            p.grad = grad[a:b].view_as(p)
        self.step_own()

    @property
    def state_keys(self) -> StateKeys:
        """Those of the OptimizerSpec servers rebuild it as (the same class and
        hyperparameters, so a handover's two ends agree); elementwise classes only: one
        whose state is per whole tensor (Adafactor's factors) has no flat form."""
        cls = type(self.optimizer)
        if ELEMENTWISE.get(cls.__name__) is not cls:
            raise ConfigError(f"{cls.__name__} keeps its state per whole tensor, which has "
                              "no flat form")
        return kept_state(cls, constructor_hyper(self.optimizer))

    def state_dict(self) -> dict:
        """torch's own state of it (any class: what a checkpoint keeps)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def flat_state(self) -> dict:
        """Its flat state (optim.py), as TorchUpdater's: each per-element entry of its
        parameters' states flattened and joined in flat order, its scalars (Adam's step)
        once ({} before any step). `step` hands every parameter its gradient, so they all
        step together and their scalars agree."""
        states = [self.optimizer.state.get(p, {}) for p in self.flat.params]
        if not states[0]:
            return {}
        elementwise, _ = self.state_keys
        return joined([{k: v.reshape(-1) if k in elementwise else v for k, v in s.items()}
                       for s in states])


def trained_parameters(optimizer: torch.optim.Optimizer, flat: FlatParameters) -> list[int]:
    """The group of each of the model's trained parameters, in flat order; one line if the
    optimizer holds a parameter that is not the model's."""
    group_of = {id(p): g for g, group in enumerate(optimizer.param_groups)
                for p in group["params"]}
    ours = {id(p) for p in flat.params}
    if any(p.requires_grad and id(p) not in ours
           for group in optimizer.param_groups for p in group["params"]):
        raise ConfigError("the optimizer holds parameters that are not the wrapped model's: "
                          "wrap the model its parameters come from")
    missing = [i for i, p in enumerate(flat.params) if id(p) not in group_of]
    if missing:
        raise ConfigError(f"the optimizer does not hold {len(missing)} of the model's "
                          f"{len(flat.params)} trained parameters: give it model.parameters() "
                          "(or freeze those with requires_grad_(False))")
    return [group_of[id(p)] for p in flat.params]


def constructor_hyper(optimizer: torch.optim.Optimizer) -> dict:
    """Group 0's hyperparameters that its class's constructor takes (a group may hold
    more: AdamW's decoupled_weight_decay)."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in optimizer.param_groups[0].items()
            if k in accepted and k not in _NOT_HYPER}


def optimizer_spec(optimizer: torch.optim.Optimizer, flat: FlatParameters,
                   strategy: str) -> OptimizerSpec:
    """The user's optimizer as servers rebuild it: its class (one whose update of an element
    reads only that element: others are one line), its group 0's hyperparameters, and each
    parameter's span of the flat model with what its group sets otherwise (merged where
    neighbours agree). A group's lr becomes its ratio to group 0's (optim.TorchUpdater)."""
    cls = type(optimizer)
    if ELEMENTWISE.get(cls.__name__) is not cls:
        raise ConfigError(f"{cls.__name__} is not an elementwise optimizer (its update "
                          f"reads a whole tensor), so {strategy}'s servers cannot step it "
                          f"on their slices: use one of {', '.join(ELEMENTWISE)}, or a "
                          "strategy without servers (allreduce, localsgd, ...)")
    groups = [{k: v for k, v in g.items() if k not in _NOT_HYPER}
              for g in optimizer.param_groups]
    hyper = constructor_hyper(optimizer)
    owner = trained_parameters(optimizer, flat)
    spans: list[tuple[int, int, dict]] = []
    owners: list[int] = []
    for g, (a, b) in zip(owner, flat.ranges, strict=True):
        over = {k: v for k, v in groups[g].items() if k not in hyper or hyper[k] != v}
        if spans and owners[-1] == g and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b, over)
        else:
            spans.append((a, b, over))
            owners.append(g)
    return OptimizerSpec(cls.__name__, hyper, spans, owners,
                         Hyperparameters(optimizer).riding, len(groups))


class Hyperparameters:
    """A user's optimizer's param-group settings as each push carries them to the servers:
    every number of every group (lr, momentum, betas, weight decay, eps, ...), read at each
    step, so whatever a scheduler changes (OneCycleLR's momentum too) changes the servers'
    steps from that push on, each update at its push's settings. A setting that is not a
    number (nesterov, amsgrad, foreach, ...) cannot ride: it must stay as it was at
    job.wrap, and so must the groups (one line otherwise, never a silent drop)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        groups = optimizer.param_groups
        common = set.intersection(*(set(g) for g in groups)) - _NOT_HYPER
        self.riding = tuple((k, _width(groups[0][k])) for k in sorted(common)
                            if all(_width(g[k]) == _width(groups[0][k]) > 0 for g in groups))
        self.fixed = [self._fixed(g) for g in groups]

    def _fixed(self, group: dict) -> dict:
        ride = {k for k, _ in self.riding}
        return {k: v for k, v in group.items() if k not in ride and k not in _NOT_HYPER}

    def values(self) -> list[float]:
        """Every group's riding settings now, in order (one line if the groups or a setting
        that cannot ride changed since job.wrap)."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self.fixed):
            raise ConfigError(f"the optimizer has {len(groups)} param groups, {len(self.fixed)}"
                              " when it was wrapped: the servers step the groups it had "
                              "then; add every group before job.wrap")
        values: list[float] = []
        for g, (group, fixed) in enumerate(zip(groups, self.fixed, strict=True)):
            for key, width in self.riding:
                value = group[key]
                values.extend(map(float, value) if width > 1 else (float(value),))
            if len(fixed) and self._fixed(group) != fixed:
                key = next(k for k in fixed if group.get(k) != fixed[k])
                raise ConfigError(f"param group {g}'s {key} changed from {fixed[key]!r} to "
                                  f"{group.get(key)!r} after job.wrap: the servers follow "
                                  "each group's numbers as they change, not this setting")
        return values


def _width(value) -> int:
    """How many numbers a setting is (0: not numbers, so it cannot ride on a push)."""
    def number(v) -> bool:
        return (isinstance(v, int | float) and not isinstance(v, bool)) or (
            isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point())
    if number(value):
        return 1
    if isinstance(value, tuple | list) and value and all(number(v) for v in value):
        return len(value)
    return 0
