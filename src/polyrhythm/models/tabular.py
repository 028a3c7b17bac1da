"""The models of the Spark MLlib against parameter-server study (the asynchronous-training
thesis, its chapter 2): linear regression on YearPredictionMSD, binary logistic regression
and a 28-15-15-2 perceptron on HIGGS. Any feature vector (or sample flattened into one), any
output count: the loss sets it (mse and bce one output, cross_entropy one per class)."""

from __future__ import annotations

import math

from torch import nn


def linear(shape: tuple[int, ...], classes: int) -> nn.Module:
    """One linear layer: linear regression under --loss mse, logistic regression under bce,
    softmax (multinomial logistic) regression under cross_entropy."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), classes))


def perceptron(shape: tuple[int, ...], classes: int) -> nn.Module:
    """A multilayer perceptron as Spark MLlib's MultilayerPerceptronClassifier builds it: two
    hidden layers of 15 sigmoid units (the study's 28-15-15-2 on HIGGS), then the outputs."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 15), nn.Sigmoid(),
                         nn.Linear(15, 15), nn.Sigmoid(), nn.Linear(15, classes))
