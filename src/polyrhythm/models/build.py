"""Build the model a run's [model] settings name."""

from __future__ import annotations

import torch
from torch import nn

from polyrhythm.errors import PolyrhythmError
from polyrhythm.models import MODELS
from polyrhythm.settings import load_object


def build_model(model, shape: tuple[int, ...], classes: int, seed: int) -> nn.Module:
    """The model a run's [model] settings name (or a model's name, with its defaults). The
    same seed gives the same initial weights on every process. The builder gets the model's
    own settings as keyword arguments."""
    torch.manual_seed(seed)
    return _build(model, shape, classes)


def check_model(model, shape: tuple[int, ...], classes: int) -> None:
    """Raise the model's own one-line error for samples of `shape` (an image model given
    feature vectors), before any process starts. The model is built on PyTorch's meta
    device: no memory, no arithmetic, and no draw from the random generator of the
    caller. Only the builder's own errors count: anything else a builder may not do on the
    meta device is left to the ranks, which build the model for real."""
    try:
        with torch.device("meta"):
            _build(model, shape, classes)
    except PolyrhythmError:
        raise
    except Exception:  # noqa: BLE001 - not a verdict on the data: see above
        pass


def _build(model, shape: tuple[int, ...], classes: int) -> nn.Module:
    spec = MODELS.lookup(model if isinstance(model, str) else model.name)
    own = {p.name: p.default if isinstance(model, str) else model[p.name] for p in spec.params}
    return load_object(spec.builder)(tuple(shape), classes, **own)
