"""Build the model a run's [model] settings name."""

from __future__ import annotations

import torch
from torch import nn

from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.losses import LOSSES
from polyrhythm.models import MODELS
from polyrhythm.settings import load_object


def build_model(model, shape: tuple[int, ...], classes: int, seed: int,
                loss: str = "cross_entropy") -> nn.Module:
    """The model a run's [model] settings name (or a model's name, with its defaults), with
    the outputs its `loss` needs for data of `classes` classes (cross_entropy: one per class;
    mse, bce: one). The same seed gives the same initial weights on every process. The
    builder gets the model's own settings as keyword arguments."""
    torch.manual_seed(seed)
    return _build(model, shape, LOSSES[loss].outputs(classes))


def check_model(model, shape: tuple[int, ...], classes: int,
                loss: str = "cross_entropy") -> None:
    """Raise the model's own one-line error for samples of `shape` (an image model given
    feature vectors), or a ConfigError where its output does not fit the `loss` (a model of
    10 outputs for mse), before any process starts. The model is built and run on a batch
    of two samples on the CPU, the caller's random generator forked around it (the draws of
    its initialisation are not the caller's). Not on PyTorch's meta device: its kernels
    (relu's, empty_like's) import torch._dynamo and sympy, a second and a half of the
    launcher's start-up, more than building any registered model takes. Only the builder's
    own errors and the output's shape count: anything else is left to the ranks, which
    build and run the model themselves."""
    task = LOSSES[loss]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            net = _build(model, shape, task.outputs(classes)).eval()
            shape_out = tuple(net(torch.zeros(2, *shape)).shape)
    except PolyrhythmError:
        raise
    except Exception:  # noqa: BLE001 - not a verdict on the data: see above
        return
    problem = task.misfit(shape_out, classes)
    if problem:
        name = model if isinstance(model, str) else model.name
        raise ConfigError(f"model {name}: {problem}")


def _build(model, shape: tuple[int, ...], classes: int) -> nn.Module:
    spec = MODELS.lookup(model if isinstance(model, str) else model.name)
    own = {p.name: p.default if isinstance(model, str) else model[p.name] for p in spec.params}
    return load_object(spec.builder)(tuple(shape), classes, **own)
