"""A data set as a loader finds it (`Source`), and the part of it one process holds
(`Dataset`).

A source gives its labels at once and its samples only for the rows asked for, so a worker
reads its own shard and the validation set and nothing more, and a server reads nothing.
Samples stay as the source stores them (CIFAR and MNIST as uint8 pixels: a quarter of
float32) and are normalised, and augmented if asked, one batch at a time.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from polyrhythm.errors import DataError

PAD = 4  # pixels of zero padding around an image before a random crop back to its size


@dataclass(frozen=True)
class Normalisation:
    """x -> (x - mean) / std in the samples' stored units: one entry per channel of an image,
    per feature of a vector, or one for all."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, x: np.ndarray) -> Normalisation:
        """One mean and standard deviation over all of `x` (computed in float64)."""
        return cls((float(x.mean(dtype=np.float64)),), (float(x.std(dtype=np.float64)) + 1e-8,))


class Source(ABC):
    """A data set's rows 0 .. size-1: the last `given_val` of them are its own validation
    part (CIFAR's test batch), if it has one; otherwise a share is held out at random."""

    shape: tuple[int, ...]
    classes: int
    norm: Normalisation
    given_val: int = 0
    augment: bool = False

    def check(self) -> None:  # noqa: B027 (most sources have nothing to check)
        """Raise a one-line DataError if the data cannot be read, reading as little as it
        can (the launcher's pre-check, before any process starts)."""

    @abstractmethod
    def labels(self) -> np.ndarray:
        """Every row's label: int64 class ids, or (a CSV file's target column) float64
        values, which the run's loss checks and converts (losses.py `targets`)."""

    @abstractmethod
    def rows(self, *selections: np.ndarray) -> list[np.ndarray]:
        """The stored samples of each selection of rows, in the order given (one pass over
        the source for all of them)."""


class ArraySource(Source):
    """A data set already in memory (small packaged ones, generated ones, a user's arrays)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, classes: int, *,
                 given_val: int = 0, norm: Normalisation | None = None,
                 real_targets: bool = False) -> None:
        # Class ids, unless the targets are real values (one output: --loss mse).
        self.x, self.y = x, y.astype(np.float64 if real_targets else np.int64)
        self.shape, self.classes = tuple(x.shape[1:]), classes
        self.given_val = given_val
        self.norm = norm or Normalisation.of(x[:len(x) - given_val])

    def labels(self) -> np.ndarray:
        return self.y

    def rows(self, *selections: np.ndarray) -> list[np.ndarray]:
        return [self.x[s] for s in selections]


def compact(x: np.ndarray) -> np.ndarray:
    """Samples as they are best kept: integers that fit a byte as uint8, others as float32."""
    if np.issubdtype(x.dtype, np.integer) and x.size and x.min() >= 0 and x.max() <= 255:
        return x.astype(np.uint8, copy=False)
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"samples must be real numbers, got dtype {x.dtype}")
    return x.astype(np.float32, copy=False)


@dataclass(frozen=True)
class Dataset:
    """Stored samples x (n, *shape), targets y (n,) as the run's loss takes them (int64
    class ids, or float32 values for mse), and how a batch of them is made."""

    x: torch.Tensor
    y: torch.Tensor
    classes: int
    norm: Normalisation
    augment: bool = False

    @classmethod
    def of(cls, source: Source, x: np.ndarray, y: np.ndarray) -> Dataset:
        return cls(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y),
                   source.classes, source.norm, source.augment)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: torch.Tensor | slice,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples (float32, normalised) and labels of rows `idx`. With a generator and
        augmentation on, each image is randomly cropped and flipped first (training only)."""
        # Rows of its own (a slice of float rows would otherwise be the data set itself),
        # normalised in place: one batch-sized tensor made instead of three. index_select
        # gathers rows several times faster than indexing with a tensor (64 CIFAR images:
        # 0.03 ms against 0.15-0.3 ms).
        if isinstance(idx, torch.Tensor):
            rows, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        else:
            rows, y = self.x[idx].clone(), self.y[idx]
        x = rows.float()
        if self.augment and generator is not None and x.dim() == 4:
            x = crop_and_flip(x, generator)
        return normalise_(x, self.norm), y

    def subset(self, idx: np.ndarray) -> Dataset:
        t = torch.from_numpy(idx)
        return Dataset(self.x[t], self.y[t], self.classes, self.norm, self.augment)


def normalise(x: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    return normalise_(x.clone(), norm)


def normalise_(x: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    """`normalise` in place: float32 `x` itself, (x - mean) / std (the same bits)."""
    mean, std = _statistics(norm, x.dim() == 4)
    return x.sub_(mean).div_(std)


@functools.lru_cache(maxsize=16)
def _statistics(norm: Normalisation, images: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std as tensors that broadcast against a batch: per channel (C, 1, 1)
    against images (n, C, H, W), per feature (F,) against (n, F), or one for all."""
    mean, std = torch.tensor(norm.mean), torch.tensor(norm.std)
    if len(norm.mean) > 1 and images:
        mean, std = mean.view(-1, 1, 1), std.view(-1, 1, 1)
    return mean, std


def crop_and_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image of (n, C, H, W) cropped back to H x W at a random offset of its zero-padded
    copy, and flipped left-right with probability 1/2 (the standard CIFAR augmentation)."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
    offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=generator).tolist()
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.stack([padded[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets)])
    return torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)
