"""Models, by name. A model is declared here with its own settings; its builder takes the
sample shape and class count and returns an nn.Module, named lazily so that checking a config
or listing models imports neither torch nor the builders. A new model is a builder and one
`MODELS.register` line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.settings import Component, Registry


@dataclass(frozen=True)
class ModelSpec(Component):
    """A registered model: `builder(shape, classes, **its settings)` returns an nn.Module
    (or names one as "package.module:function")."""

    builder: str | Callable = ""


BUILDERS = "polyrhythm.models.small"
MODELS: Registry[ModelSpec] = Registry("model")

MODELS.register(ModelSpec("cnn", "two 3x3 conv blocks (16, 32 channels) with max-pooling, "
                          "then a 64-unit head", builder=f"{BUILDERS}:cnn"))
MODELS.register(ModelSpec("mlp", "two hidden layers of 128 and 64 units",
                          builder=f"{BUILDERS}:mlp"))
