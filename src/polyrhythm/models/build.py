"""Build the model a run's [model] settings name."""

from __future__ import annotations

import torch
from torch import nn

from polyrhythm.models import MODELS
from polyrhythm.settings import load_object


def build_model(model, shape: tuple[int, ...], classes: int, seed: int) -> nn.Module:
    """The model a run's [model] settings name (or a model's name, with its defaults). The
    same seed gives the same initial weights on every process. The builder gets the model's
    own settings as keyword arguments."""
    torch.manual_seed(seed)
    spec = MODELS.lookup(model if isinstance(model, str) else model.name)
    own = {p.name: p.default if isinstance(model, str) else model[p.name] for p in spec.params}
    return load_object(spec.builder)(tuple(shape), classes, **own)
