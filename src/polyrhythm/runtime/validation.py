"""Validation: a model's loss (and, for losses that classify, accuracy) on held-out data, in
eval mode."""

from __future__ import annotations

import torch
from torch import nn

from polyrhythm.data.source import Dataset
from polyrhythm.losses import LOSSES, Loss

# Validation batches: larger ones are no faster on a CPU, and a batch's activations add to
# the worker's peak memory (1,000 CIFAR images through the cnn: about 140 MB).
VALIDATION_BATCH = 250


@torch.no_grad()
def validation_sums(model: nn.Module, data: Dataset, loss: Loss, part: slice = slice(None),
                    batch: int = VALIDATION_BATCH) -> list[float]:
    """The summed `loss` of `model`, in eval mode (BatchNorm uses its running statistics), on
    rows `part` of `data`, and its correct predictions where the loss classifies: sums that
    add up across parts (validation_record turns them into figures)."""
    total, correct = 0.0, 0
    rows = range(len(data))[part]
    model.eval()
    try:
        for start in range(rows.start, rows.stop, batch):
            x, target = data.batch(slice(start, min(start + batch, rows.stop)))
            output = model(x)
            total += loss(output, target, reduction="sum").item()
            if loss.classifies:
                correct += loss.correct(output, target)
    finally:
        model.train()
    return [total, correct] if loss.classifies else [total]


def validation_record(sums: list[float], size: int, loss: Loss) -> dict[str, float]:
    """The mean loss of `size` samples (val_loss) and, where the loss classifies, their
    accuracy (val_accuracy), from validation_sums (or their sum over parts)."""
    record = {"val_loss": sums[0] / size}
    if loss.classifies:
        record["val_accuracy"] = sums[1] / size
    return record


def evaluate(model: nn.Module, data: Dataset,
             loss: Loss = LOSSES["cross_entropy"]) -> dict[str, float]:
    """Mean loss and, where the loss classifies, accuracy of `model` on `data`, in eval
    mode."""
    return validation_record(validation_sums(model, data, loss), len(data), loss)
