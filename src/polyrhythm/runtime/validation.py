"""Validation: a model's loss and accuracy on held-out data, in eval mode."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from polyrhythm.data.source import Dataset

# Validation batches: larger ones are no faster on a CPU, and a batch's activations add to
# the worker's peak memory (1,000 CIFAR images through the cnn: about 140 MB).
VALIDATION_BATCH = 250


@torch.no_grad()
def validation_sums(model: nn.Module, data: Dataset, part: slice = slice(None),
                    batch: int = VALIDATION_BATCH) -> tuple[float, int]:
    """Summed cross-entropy and correct predictions of `model`, in eval mode (BatchNorm
    uses its running statistics), on rows `part` of `data`."""
    loss, correct = 0.0, 0
    rows = range(len(data))[part]
    model.eval()
    try:
        for start in range(rows.start, rows.stop, batch):
            x, target = data.batch(slice(start, min(start + batch, rows.stop)))
            logits = model(x)
            loss += F.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(1) == target).sum().item()
    finally:
        model.train()
    return loss, correct


def evaluate(model: nn.Module, data: Dataset) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `model` on `data`, in eval mode."""
    loss, correct = validation_sums(model, data)
    return {"val_loss": loss / len(data), "val_accuracy": correct / len(data)}
