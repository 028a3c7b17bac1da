"""Emulated compute: a worker sleeps for its step's compute time instead of running forward
and backward, while every message stays real and full-size. Sixteen or thirty-two workers
then fit on two cores to study communication and consistency.

The step still ends in a backward, of a zero loss over every parameter, so the gradients are
real tensors of the model's real size (zeros) and gradient hooks (a parameter server's
bucketed pushes) fire as in a real step; it costs a pass over the parameters, no more.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn


def emulated_step(model: nn.Module, seconds: float) -> float:
    """Sleep for `seconds`, then leave zero gradients in `model` by a backward of a zero
    loss; the loss is not known (NaN)."""
    model.zero_grad(set_to_none=True)
    time.sleep(seconds)
    zero = torch.stack([p.sum() for p in model.parameters() if p.requires_grad]).sum() * 0.0
    zero.backward()
    return math.nan
