"""The losses a run trains with (its `loss` setting), each in one place: what the model must
output, which targets it takes, the training loss of a batch and the validation sums.

- `cross_entropy`: classes 0..C-1, C outputs (logits); validation adds accuracy (argmax).
- `mse`: real-valued targets (regression), one output per sample; no accuracy.
- `bce`: two classes 0 and 1, one logit per sample (`binary_cross_entropy_with_logits`);
  accuracy counts a logit above 0 as class 1.

bce's targets stay class ids (int64) in the data, as cross_entropy's do, so that stratified
sharding and the shards' class statistics see two classes; they become the logits' dtype in
the loss. mse's targets are float32 values. A run checks the data's targets and the model's
output against its loss before any process starts (api.py), with one-line ConfigErrors.

The names are declared, torch-free, in config/declared.py (LOSS_NAMES); a test checks the two
agree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
import torch.nn.functional as F

from polyrhythm.errors import ConfigError
from polyrhythm.limits import MAX_CLASSES
from polyrhythm.settings import number


class Loss(ABC):
    """A loss, by its `name`. Where it `classifies`, its targets are classes: validation
    also counts correct predictions (`val_accuracy`), and splitters see the classes."""

    name: str
    classifies: bool

    @abstractmethod
    def __call__(self, output: torch.Tensor, target: torch.Tensor,
                 reduction: str = "mean") -> torch.Tensor:
        """The loss of a batch: its mean (training) or its sum (validation)."""

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> int:
        """Correct predictions in a batch (losses with accuracy only)."""
        raise NotImplementedError(f"{self.name} has no accuracy")

    def outputs(self, classes: int) -> int:
        """The model's outputs per sample for data of `classes` classes."""
        return 1

    @abstractmethod
    def targets(self, labels: np.ndarray, classes: int, where: str) -> np.ndarray:
        """The data's labels as this loss's targets, checked: a ConfigError naming `where`
        (the data set) and the first unfit target."""

    def misfit(self, shape: tuple[int, ...], classes: int) -> str | None:
        """What is wrong with a model output of `shape` for a batch of 2 samples (None: it
        fits): one value per sample, as (2,) or (2, 1)."""
        if tuple(shape) in ((2,), (2, 1)):
            return None
        return f"loss {self.name} needs one output per sample; the model gives {_per(shape)}"


def _per(shape: tuple[int, ...]) -> str:
    """A batch's output shape as per-sample words: (2, 10) -> 'outputs of shape (10,)'."""
    return f"outputs of shape {tuple(shape[1:])}" if len(shape) > 1 else "a scalar"


def _first_unfit(labels: np.ndarray, bad: np.ndarray, where: str, name: str,
                 needs: str) -> None:
    """A ConfigError for the first label `bad` marks, if any."""
    found = np.flatnonzero(bad)
    if len(found):
        i = int(found[0])
        raise ConfigError(f"{where}: loss {name} needs {needs}; example {i + 1} has target "
                          f"{number(labels[i])}")


def _one_per_sample(output: torch.Tensor) -> torch.Tensor:
    """(n,) or (n, 1) as (n,); anything else fails in torch (the launcher refuses it first)."""
    return output.reshape(len(output))


class CrossEntropy(Loss):
    name, classifies = "cross_entropy", True

    def __call__(self, output, target, reduction="mean"):
        return F.cross_entropy(output, target, reduction=reduction)

    def correct(self, output, target):
        return (output.argmax(1) == target).sum().item()

    def outputs(self, classes):
        return classes

    def targets(self, labels, classes, where):
        # A logit per class up to the largest id: an id of 2**40 would make a model of 2**40
        # outputs, which no process can build (limits.py).
        needs = (f"class ids 0, 1, 2, ... below {MAX_CLASSES:,} (--loss mse for real-valued "
                 "targets)")
        if np.issubdtype(labels.dtype, np.integer):  # from 0: checked by sources
            _first_unfit(labels, labels >= MAX_CLASSES, where, self.name, needs)
            return labels.astype(np.int64, copy=False)
        _first_unfit(labels, (labels < 0) | (labels != np.floor(labels))
                     | (labels >= MAX_CLASSES), where, self.name, needs)
        return labels.astype(np.int64)

    def misfit(self, shape, classes):
        if len(shape) == 2 and shape[1] >= classes:
            return None
        return (f"loss {self.name} needs a logit per class ({classes}) for each sample; the "
                f"model gives {_per(shape)}")


class MeanSquaredError(Loss):
    name, classifies = "mse", False

    def __call__(self, output, target, reduction="mean"):
        return F.mse_loss(_one_per_sample(output), target.to(output.dtype), reduction=reduction)

    def targets(self, labels, classes, where):
        return labels.astype(np.float32)


class BinaryCrossEntropy(Loss):
    name, classifies = "bce", True

    def __call__(self, output, target, reduction="mean"):
        return F.binary_cross_entropy_with_logits(_one_per_sample(output),
                                                  target.to(output.dtype), reduction=reduction)

    def correct(self, output, target):
        return ((_one_per_sample(output) > 0) == target.bool()).sum().item()

    def targets(self, labels, classes, where):
        if classes > 2:
            raise ConfigError(f"{where}: loss {self.name} needs two classes, 0 and 1; the "
                              f"data has {classes}")
        _first_unfit(labels, (labels != 0) & (labels != 1), where, self.name, "targets 0 and 1")
        return labels.astype(np.int64)


LOSSES: dict[str, Loss] = {loss.name: loss for loss in (CrossEntropy(), MeanSquaredError(),
                                                        BinaryCrossEntropy())}
