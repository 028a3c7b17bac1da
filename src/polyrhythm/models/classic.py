"""Plain (non-residual) convolutional networks for CIFAR-sized images: AlexNet, VGG-16 and
GoogLeNet, each after its paper and scaled to 32×32 inputs as documented per builder."""

from __future__ import annotations

import torch
from torch import nn

from polyrhythm.models.blocks import conv_bn, head, image_model


def _overlapping_pool() -> nn.MaxPool2d:
    """3×3 max-pooling at stride 2, padded: halves the resolution (rounding up), down to 1×1."""
    return nn.MaxPool2d(3, 2, padding=1)


@image_model
def alexnet(channels: int, classes: int) -> nn.Module:
    """AlexNet (Krizhevsky et al. 2012) sized for 32×32 inputs: 4.56 M parameters for 3
    channels and 10 classes.

    Five convolutions with ReLU, of 64, 192, 384, 256 and 256 channels (the one-GPU widths
    of Krizhevsky 2014, One weird trick for parallelizing convolutional neural networks;
    the paper's two towers have 96, 256, 384, 384, 256) and kernels 5, 5, 3, 3, 3 (the
    first at stride 1 in place of 11×11 at stride 4). As in the paper, local response
    normalisation (k = 2, n = 5, α = 1e-4, β = 0.75) follows conv1 and conv2, and
    overlapping 3×3 max-pooling at stride 2 follows both normalisations and conv5
    (32 → 16 → 8 → 4). The classifier averages the map to 2×2 (1024 features) and has the
    paper's three fully connected layers, narrowed to 1024, 1024 and `classes` units, with
    dropout 0.5 before the first two."""

    def conv(inputs: int, outputs: int, kernel: int) -> list[nn.Module]:
        return [nn.Conv2d(inputs, outputs, kernel, padding=kernel // 2), nn.ReLU(inplace=True)]

    def normalise() -> nn.Module:  # torch divides α by n; the paper's α is for the sum
        return nn.LocalResponseNorm(5, alpha=5 * 1e-4, beta=0.75, k=2.0)

    def dense(inputs: int, outputs: int) -> list[nn.Module]:
        return [nn.Dropout(0.5), nn.Linear(inputs, outputs), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *conv(channels, 64, 5), normalise(), _overlapping_pool(),
        *conv(64, 192, 5), normalise(), _overlapping_pool(),
        *conv(192, 384, 3), *conv(384, 256, 3), *conv(256, 256, 3), _overlapping_pool(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        *dense(256 * 2 * 2, 1024), *dense(1024, 1024), nn.Linear(1024, classes))


@image_model
def vgg16(channels: int, classes: int) -> nn.Module:
    """VGG-16 (Simonyan & Zisserman 2015, configuration D) for 32×32 inputs: thirteen 3×3
    convolutions in five blocks of 64, 128, 256, 512 and 512 channels (2, 2, 3, 3, 3 convs),
    each block ending in 2×2 max-pooling (32 → 1); BatchNorm (Ioffe & Szegedy 2015) after
    every convolution, and one linear layer from 512 features in place of the three fully
    connected ones."""
    layers: list[nn.Module] = []
    for width, convs in [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]:
        for _ in range(convs):
            layers.append(conv_bn(channels, width, 3))
            channels = width
        layers.append(nn.MaxPool2d(2, ceil_mode=True))  # rounding up: any size down to 1×1
    return nn.Sequential(*layers, head(channels, classes))


class Inception(nn.Module):
    """One inception module: four branches, concatenated along the channels: 1×1; 1×1 then
    3×3; 1×1 then 5×5; 3×3 max-pooling (stride 1) then 1×1."""

    def __init__(self, inputs: int, ones: int, reduce3: int, threes: int, reduce5: int,
                 fives: int, pool: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList([
            conv_bn(inputs, ones, 1),
            nn.Sequential(conv_bn(inputs, reduce3, 1), conv_bn(reduce3, threes, 3)),
            nn.Sequential(conv_bn(inputs, reduce5, 1), conv_bn(reduce5, fives, 5)),
            nn.Sequential(nn.MaxPool2d(3, 1, padding=1), conv_bn(inputs, pool, 1))])
        self.outputs = ones + threes + fives + pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


# Table 1 of the paper: #1×1, #3×3 reduce, #3×3, #5×5 reduce, #5×5, pool proj, per module;
# the stages (3a-3b, 4a-4e, 5a-5b) are separated by max-pooling.
GOOGLENET = [
    [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)],
    [(192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
     (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)],
    [(256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)],
]


@image_model
def inception(channels: int, classes: int) -> nn.Module:
    """GoogLeNet, Inception-v1 (Szegedy et al. 2015, Going Deeper with Convolutions) for
    32×32 inputs: a 3×3 stem convolution of 192 channels in place of the paper's 7×7/max-pool
    stem, then inception modules 3a-3b, max-pool, 4a-4e, max-pool, 5a-5b with the paper's
    branch widths (1024 channels out), global average pooling, dropout 0.4 and a linear
    layer. BatchNorm (Ioffe & Szegedy 2015) follows every convolution; the paper's two
    auxiliary classifiers are left out."""
    layers: list[nn.Module] = [conv_bn(channels, 192, 3)]
    inputs = 192
    for i, modules in enumerate(GOOGLENET):
        if i:
            layers.append(_overlapping_pool())
        for widths in modules:
            layers.append(Inception(inputs, *widths))
            inputs = layers[-1].outputs
    return nn.Sequential(*layers, head(inputs, classes, dropout=0.4))
