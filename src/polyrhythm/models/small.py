"""Small models for quick runs on the packaged data sets: any sample shape, any class count."""

from __future__ import annotations

import math

from torch import nn


def cnn(shape: tuple[int, ...], classes: int) -> nn.Module:
    """Two 3x3 conv blocks (16, 32 channels) with max-pooling, then a 64-unit head."""
    flat_input = len(shape) != 3
    c, h, w = (1, 1, math.prod(shape)) if flat_input else shape
    pools = 2 if min(h, w) >= 4 else 0
    layers: list[nn.Module] = [nn.Conv2d(c, 16, 3, padding=1), nn.ReLU()]
    if pools:
        layers.append(nn.MaxPool2d(2))
    layers += [nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()]
    if pools:
        layers.append(nn.MaxPool2d(2))
    flat = 32 * (h // 2**pools) * (w // 2**pools)
    layers += [nn.Flatten(), nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, classes)]
    if flat_input:  # a feature vector becomes a 1-pixel-high image
        layers.insert(0, nn.Unflatten(1, (c, h, w)))
    return nn.Sequential(*layers)


def mlp(shape: tuple[int, ...], classes: int) -> nn.Module:
    """Two hidden layers of 128 and 64 units."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 128), nn.ReLU(),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, classes))
