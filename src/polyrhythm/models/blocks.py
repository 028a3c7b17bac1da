"""Pieces the image models share: the builder decorator that checks the sample is an image,
the conv-BatchNorm-ReLU unit and the global-average-pool classifier head."""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

from polyrhythm.errors import ConfigError


def image_model(build: Callable[[int, int], nn.Module]) -> Callable[..., nn.Module]:
    """A model builder `name(shape, classes)` from `build(channels, classes)`: the sample
    shape must be (channels, height, width), any height and width (the models end in a
    global average pool). Convolutions get He et al.'s (2015) initialisation, the one the
    ResNet paper uses (Delving Deep into Rectifiers); BatchNorm keeps scale 1, shift 0."""

    @functools.wraps(build)
    def builder(shape: tuple[int, ...], classes: int) -> nn.Module:
        if len(shape) != 3:
            raise ConfigError(f"model {build.__name__} needs image samples (channels, height, "
                              f"width); dataset gives shape {tuple(shape)}")
        model = build(shape[0], classes)
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        return model

    return builder


def conv_bn(inputs: int, outputs: int, kernel: int, stride: int = 1,
            relu: bool = True) -> nn.Sequential:
    """A k×k convolution ('same' padding, no bias: BatchNorm has one), BatchNorm, ReLU."""
    layers: list[nn.Module] = [nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2,
                                         bias=False), nn.BatchNorm2d(outputs)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def head(channels: int, classes: int, dropout: float = 0.0) -> nn.Sequential:
    """Global average pool over the feature map, optional dropout, one linear layer."""
    layers: list[nn.Module] = [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(channels, classes))
