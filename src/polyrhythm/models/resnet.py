"""Residual networks for CIFAR-sized images, after He et al. 2016, Deep Residual Learning
for Image Recognition: the paper's own CIFAR-10 networks (section 4.2) and its ImageNet
ResNet-18 and ResNet-50 (table 1) with a stem for 32×32 inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from polyrhythm.models.blocks import conv_bn, head, image_model

Part = Callable[[int, int, int], nn.Module]  # (input channels, output channels, stride)


class Residual(nn.Module):
    """One residual block: relu(body(x) + shortcut(x))."""

    def __init__(self, body: nn.Module, shortcut: nn.Module) -> None:
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class PadShortcut(nn.Module):
    """The paper's option A shortcut, free of parameters: every `stride`-th pixel, with
    `extra` zero channels appended."""

    def __init__(self, extra: int, stride: int) -> None:
        super().__init__()
        self.extra, self.stride = extra, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.extra))


def basic(inputs: int, outputs: int, stride: int) -> nn.Module:
    """The basic block's body: two 3×3 convolutions, the first strided."""
    return nn.Sequential(conv_bn(inputs, outputs, 3, stride),
                         conv_bn(outputs, outputs, 3, relu=False))


def bottleneck(inputs: int, outputs: int, stride: int) -> nn.Module:
    """The bottleneck block's body: 1×1 down to a quarter of `outputs` channels, 3×3
    (strided, as in most implementations; the paper strides the first 1×1, with the same
    parameter count), 1×1 up to `outputs`."""
    width = outputs // 4
    return nn.Sequential(conv_bn(inputs, width, 1), conv_bn(width, width, 3, stride),
                         conv_bn(width, outputs, 1, relu=False))


def padded(inputs: int, outputs: int, stride: int) -> nn.Module:
    """Identity shortcut, or option A (subsample, pad channels with zeros) where the shape
    changes."""
    if stride == 1 and inputs == outputs:
        return nn.Identity()
    return PadShortcut(outputs - inputs, stride)


def projected(inputs: int, outputs: int, stride: int) -> nn.Module:
    """Identity shortcut, or option B (a strided 1×1 convolution and BatchNorm) where the
    shape changes."""
    if stride == 1 and inputs == outputs:
        return nn.Identity()
    return conv_bn(inputs, outputs, 1, stride, relu=False)


def stage(inputs: int, outputs: int, blocks: int, stride: int, body: Part,
          shortcut: Part) -> list[nn.Module]:
    """`blocks` residual blocks from `inputs` to `outputs` channels, the first strided."""
    return [Residual(body(n, outputs, s), shortcut(n, outputs, s))
            for n, s in [(inputs, stride)] + [(outputs, 1)] * (blocks - 1)]


def residual_network(channels: int, classes: int, stem: int, stages: list[tuple[int, int]],
                     body: Part, shortcut: Part) -> nn.Sequential:
    """A 3×3 stem convolution of `stem` channels, then one stage per (output channels,
    blocks), each after the first halving the resolution, then the classifier head."""
    layers = [conv_bn(channels, stem, 3)]
    inputs = stem
    for i, (outputs, blocks) in enumerate(stages):
        layers += stage(inputs, outputs, blocks, 2 if i else 1, body, shortcut)
        inputs = outputs
    return nn.Sequential(*layers, head(inputs, classes))


def cifar_resnet(channels: int, classes: int, n: int) -> nn.Sequential:
    """The paper's CIFAR-10 network of 6n + 2 layers (section 4.2): a 3×3 conv of 16
    channels, three stages of n basic blocks (16, 32, 64 channels) with option A shortcuts,
    global average pooling and a linear layer."""
    return residual_network(channels, classes, 16, [(16, n), (32, n), (64, n)], basic, padded)


@image_model
def resnet20(channels: int, classes: int) -> nn.Module:
    """ResNet-20 (n = 3), 0.27 M parameters in the paper."""
    return cifar_resnet(channels, classes, 3)


@image_model
def resnet32(channels: int, classes: int) -> nn.Module:
    """ResNet-32 (n = 5), 0.46 M parameters in the paper."""
    return cifar_resnet(channels, classes, 5)


@image_model
def resnet56(channels: int, classes: int) -> nn.Module:
    """ResNet-56 (n = 9), 0.85 M parameters in the paper."""
    return cifar_resnet(channels, classes, 9)


@image_model
def resnet18(channels: int, classes: int) -> nn.Module:
    """ResNet-18 (table 1) for 32×32 inputs: a 3×3 stem conv of 64 channels at stride 1 and
    no max-pool, then stages of 2 basic blocks (64, 128, 256, 512 channels) with projection
    shortcuts where the shape changes."""
    return residual_network(channels, classes, 64, [(64, 2), (128, 2), (256, 2), (512, 2)],
                            basic, projected)


@image_model
def resnet50(channels: int, classes: int) -> nn.Module:
    """ResNet-50 (table 1) for 32×32 inputs: the same stem, then stages of 3, 4, 6 and 3
    bottleneck blocks (256, 512, 1024, 2048 channels, expansion 4) with projection
    shortcuts where the shape changes."""
    return residual_network(channels, classes, 64,
                            [(256, 3), (512, 4), (1024, 6), (2048, 3)], bottleneck, projected)
