"""Emulated compute: a worker sleeps for its step's compute time instead of running forward
and backward, while every message stays real and full-size. Sixteen or thirty-two workers
then fit on two cores to study communication and consistency.

The step still ends in a backward through a zero that depends on every parameter, so the
gradients are real tensors of the model's real size (zeros) and gradient hooks (a parameter
server's bucketed pushes) fire as in a real step; it costs a pass over the parameters, no
more. polyrhythm train's job calls `emulated_step` in place of its forward and backward; a
user's script keeps its loop, and the model job.wrap returns computes through
`EmulatedForward` instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from torch import nn

from polyrhythm.errors import ConfigError

# Builds a stand-in for a model's output from the zero its gradients flow through (None:
# no gradient wanted).
Maker = Callable[[torch.Tensor | None], Any]


def zero_of(parameters: list[torch.Tensor]) -> torch.Tensor:
    """A zero scalar that depends on every one of `parameters`: a backward through it leaves
    each a zero gradient of its real size."""
    return torch.stack([p.sum() for p in parameters]).sum() * 0.0


def emulated_step(model: nn.Module, seconds: float) -> float:
    """Sleep for `seconds`, then leave zero gradients in `model` by a backward of a zero
    loss; the loss is not known (NaN)."""
    model.zero_grad(set_to_none=True)
    time.sleep(seconds)
    zero_of([p for p in model.parameters() if p.requires_grad]).backward()
    return math.nan


class EmulatedForward:
    """A script's model's forward under emulated compute (job.wrap sets it as the model's
    `forward`): no real forward runs. The first forward of each step with gradients enabled
    sleeps for the step's compute time (`seconds()`, drawn once a step: gradient
    accumulation's further forwards, and forwards under no_grad such as a validation, do
    not sleep); every forward returns zeros of the real output's shapes and dtypes, tied to
    every trainable parameter, so the script's own loss and backward run on them (cheaply)
    and leave zero gradients of real size, and the step exchanges them in full.

    The output's shapes for an input's are learnt once, by a real forward under no_grad that
    leaves no trace (the buffers and the random state are put back). `steps_taken()` counts
    the steps the job took, to tell a new step's forward."""

    def __init__(self, model: nn.Module, seconds: Callable[[], float],
                 steps_taken: Callable[[], int]) -> None:
        self.model, self.real_forward = model, model.forward
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.seconds, self.steps_taken = seconds, steps_taken
        self.makers: dict[Hashable, Maker] = {}  # by the input's shapes
        self.slept_at: int | None = None  # the step whose compute time was slept

    def __call__(self, *args, **kwargs) -> Any:
        key = shapes_of((args, kwargs))
        make = self.makers.get(key)
        if make is None:
            make = self.makers[key] = self._learn(args, kwargs)
        if not torch.is_grad_enabled():
            return make(None)
        if self.slept_at != self.steps_taken():
            self.slept_at = self.steps_taken()
            time.sleep(self.seconds())
        return make(zero_of(self.parameters))

    def _learn(self, args, kwargs) -> Maker:
        """How to make the output for these inputs, from one real forward."""
        buffers = [b.clone() for b in self.model.buffers()]
        cuda = sorted({p.device.index or 0 for p in self.parameters if p.is_cuda})
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            output = self.real_forward(*args, **kwargs)
            for buffer, before in zip(self.model.buffers(), buffers, strict=True):
                buffer.copy_(before)  # BatchNorm's statistics, as they were
        return maker(output, type(self.model).__name__, "output")


def shapes_of(value: Any) -> Hashable:
    """What an input's output shapes may depend on: its tensors' shapes, dtypes and devices,
    its other values where they hash (a length, a flag), in its structure."""
    if isinstance(value, torch.Tensor):
        return "tensor", tuple(value.shape), value.dtype, value.device
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(shapes_of(v) for v in value)
    if isinstance(value, Mapping):
        return "mapping", tuple((k, shapes_of(v)) for k, v in value.items())
    try:
        hash(value)
    except TypeError:
        return "unhashable", type(value).__name__
    return "value", value


def maker(output: Any, model: str, where: str) -> Maker:
    """A stand-in maker for `output` (at `where` in what `model`'s forward returned):
    tensors, None, and tuples, lists and dicts of them; anything else is one line."""
    if isinstance(output, torch.Tensor):
        shape, dtype, device = output.shape, output.dtype, output.device
        tied = dtype.is_floating_point or dtype.is_complex  # integers carry no gradient

        def zeros(zero: torch.Tensor | None) -> torch.Tensor:
            made = torch.zeros(shape, dtype=dtype, device=device)
            return made + zero.to(device) if zero is not None and tied else made
        return zeros
    if output is None:
        return lambda zero: None
    if isinstance(output, tuple | list):
        makers = [maker(v, model, f"{where}[{i}]") for i, v in enumerate(output)]
        kind = type(output)
        if hasattr(output, "_fields"):  # a namedtuple takes its fields one by one
            return lambda zero: kind(*(m(zero) for m in makers))
        return lambda zero: kind(m(zero) for m in makers)
    if isinstance(output, dict):
        makers = {k: maker(v, model, f"{where}[{k!r}]") for k, v in output.items()}
        kind = type(output)
        return lambda zero: kind((k, m(zero)) for k, m in makers.items())
    raise ConfigError(f"emulated compute stands in for {model}'s output with zeros of its "
                      f"shapes, so it takes tensors and tuples, lists or dicts of them, not "
                      f"the {type(output).__name__} at {where}: run this model with "
                      f"--compute real")
