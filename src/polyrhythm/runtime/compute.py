"""Emulated compute: a worker sleeps for its step's compute time instead of running forward
and backward, while every message stays real and full-size. Sixteen or thirty-two workers
then fit on two cores to study communication and consistency.

The step still ends in a backward, of a zero loss over every parameter, so the gradients are
real tensors of the model's real size (zeros) and gradient hooks (a parameter server's
bucketed pushes) fire as in a real step; it costs a pass over the parameters, no more.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import torch
from torch import nn

from polyrhythm.metrics.records import measured_compute
from polyrhythm.units import Delay, duration


def compute_times(config, worker: int) -> Callable[[], float] | None:
    """Worker `worker`'s source of compute seconds per step, or None for real compute: drawn
    from compute_time (its jitter and distribution, seeded by the run's seed and the worker),
    or replayed from a stored run (worker i replays its worker i mod N, looping)."""
    if config.compute != "emulated":
        return None
    if config.compute_from is not None:
        measured = measured_compute(config.out, config.compute_from)
        return itertools.cycle(measured[worker % len(measured)]).__next__
    delay = Delay(duration(config.compute_time), duration(config.compute_jitter),
                  config.compute_distribution)
    return delay.sampler(config.seed * 100_003 + worker)


def emulated_step(model: nn.Module, seconds: float) -> float:
    """Sleep for `seconds`, then leave zero gradients in `model` by a backward of a zero
    loss; the loss is not known (NaN)."""
    model.zero_grad(set_to_none=True)
    time.sleep(seconds)
    zero = torch.stack([p.sum() for p in model.parameters() if p.requires_grad]).sum() * 0.0
    zero.backward()
    return math.nan
