"""Comma-separated text files (the `csv` data set), read as the UCI repository distributes
them: HIGGS.csv.gz (gzip, no header, the 0/1 label first, 28 features, 11 million rows) and
YearPredictionMSD.txt.zip (a zip of one text file, no header, the year first, 90 features).

A file is plain text, gzip or a zip of exactly one file (told apart by their first bytes, not
by their names); its first row is a header if any cell of it is not a number. Rows are parsed
a chunk at a time by numpy's C parser, so no process holds more than its own rows and every
row's target. Nothing in a file is evaluated: every cell must be a finite number, and a cell,
a row or a file that is not is a one-line DataError naming the file (and the line and column:
lines counted from 1 as an editor shows them, columns from 0 as --target counts them).
"""

from __future__ import annotations

import gzip
import io
import math
import os
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np

from polyrhythm.data.source import Normalisation, Source
from polyrhythm.errors import DataError
from polyrhythm.files import open_regular, printable

CHUNK_LINES = 65_536  # lines parsed at once: a few MB of text and of float64 cells
CHUNK_CHARS = 64 * 2**20  # and at most about this much text, however long the lines
# A row's characters at most (a row of a million cells): a file of one endless line is read
# this far, not into memory whole.
MAX_LINE_CHARS = 16 * 2**20
# The text one file may hold (zip members declare theirs; gzip's is counted as it is read):
# twice HIGGS, the largest table this reader is meant for (7.5 GiB). A zip bomb declares far
# more; a table this size takes minutes a pass to parse, and its targets fill the memory.
MAX_TEXT_BYTES = 16 * 2**30
MAC_RESOURCE_FORKS = "__MACOSX/"  # what a Mac adds to a zip it makes: not a data file
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first file, or an empty zip's end


@contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """The text of `path` as UTF-8 (a byte-order mark, as spreadsheets write, dropped): a
    plain file, a gzip stream or a zip's one file."""
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist")
    if not path.is_file():
        raise DataError(f"data path {str(path)!r} is not a file")
    with ExitStack() as stack:
        raw = stack.enter_context(open_regular(path, "data file", DataError))
        binary = stack.enter_context(_binary(raw, path))
        yield stack.enter_context(io.TextIOWrapper(binary, encoding="utf-8-sig"))


def _binary(raw: BinaryIO, path: Path) -> BinaryIO:
    """The bytes of the text in `raw` (the file at `path`): itself, its gzip stream or its
    zip's one file."""
    try:
        magic = raw.read(4)
        raw.seek(0)
        if magic[:2] == GZIP_MAGIC:
            # Its size is only known by reading: counted then.
            return gzip.GzipFile(fileobj=raw, mode="rb")
        if magic in ZIP_MAGIC or zipfile.is_zipfile(raw):  # is_zipfile: data before it
            return _zip_member(raw, path)
        _check_declared(path, os.fstat(raw.fileno()).st_size)
        raw.seek(0)
        return raw
    except OSError as exc:
        raise DataError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def _zip_member(raw: BinaryIO, path: Path) -> BinaryIO:
    try:
        archive = zipfile.ZipFile(raw)
    # NotImplementedError, RuntimeError: what zipfile does not read (a method, encryption)
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
        raise DataError(f"cannot read zip {str(path)!r}: {exc}") from None
    with archive:  # the member keeps the file open until it is closed itself
        files = [m for m in archive.infolist()
                 if not m.is_dir() and not m.filename.startswith(MAC_RESOURCE_FORKS)]
        if len(files) != 1:
            names = [m.filename for m in files[:3]] + ["..."] * (len(files) > 3)
            listed = f" ({', '.join(map(printable, names))})" if files else ""
            raise DataError(f"zip {str(path)!r} holds {len(files)} files{listed}; it must hold "
                            "exactly one CSV file")
        _check_declared(path, files[0].file_size)
        try:
            return archive.open(files[0])
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
            raise DataError(f"cannot read zip {str(path)!r}: {exc}") from None


def _check_declared(path: Path, size: int) -> None:
    if size > MAX_TEXT_BYTES:
        raise DataError(f"{str(path)!r} declares {size / 2**30:.1f} GiB of text, more than the "
                        f"{MAX_TEXT_BYTES / 2**30:.0f} GiB this reader takes")


@dataclass
class Moments:
    """Per-column count, mean and sum of squared deviations, merged chunk by chunk (Chan et
    al.'s pairwise update: stable where a running sum of squares would cancel)."""

    n: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, values: np.ndarray) -> None:
        k, mean = len(values), values.mean(0)
        m2 = ((values - mean) ** 2).sum(0)
        if self.n == 0:
            self.n, self.mean, self.m2 = k, mean, m2
            return
        total, delta = self.n + k, mean - self.mean
        self.mean = self.mean + delta * k / total
        self.m2 = self.m2 + m2 + delta**2 * self.n * k / total
        self.n = total

    def std(self) -> np.ndarray:
        """The population standard deviation; 1 for a constant column, which then stays 0."""
        std = np.sqrt(self.m2 / self.n)
        return np.where(std > 0, std, 1.0)


@dataclass
class Table:
    """What a pass over a file found: its column names (None without a header), the target
    column, every row's target, each column's moments, and the rows asked for (features as
    float32, the target column left out), one array per selection."""

    names: list[str] | None
    target: int
    targets: np.ndarray
    moments: Moments
    selected: list[np.ndarray]

    @property
    def features(self) -> int:
        return len(self.moments.mean) - 1

    def feature_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) of each feature column."""
        keep = np.arange(len(self.moments.mean)) != self.target
        return self.moments.mean[keep], self.moments.std()[keep]


def read_table(path: Path, target: str, max_rows: int | None = None,
               selections: tuple[np.ndarray, ...] = ()) -> Table:
    """One pass over the file at `path`: every row's target (column `target`, an index from
    0, negative from the end, or a header's name), the columns' moments, and the features of
    the rows each selection names (in its order; repeats allowed). Only the first `max_rows`
    rows count, if given."""
    try:
        with open_text(path) as text:
            return _read(text, path, target, max_rows, selections)
    except UnicodeDecodeError as exc:
        raise DataError(f"{str(path)!r} is not UTF-8 text ({exc.reason})") from None
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"cannot read {str(path)!r}: {reason}") from None


def _read(text: TextIO, path: Path, target: str, max_rows: int | None,
          selections: tuple[np.ndarray, ...]) -> Table:
    line_number, first, before = _first_row(text, path)
    cells = first.rstrip("\r\n").split(",")
    header = not all(_is_number(cell) for cell in cells)
    names = [cell.strip().strip('"') for cell in cells] if header else None
    column = _target_column(target, names, len(cells), path)
    picking = [_Picking(s, len(cells) - 1) for s in selections]
    moments, targets, rows = Moments(), [], 0
    # read: characters so far (a first row that is data counts with its chunk)
    lines, read = ([], before) if header else ([first], before - len(first))
    line_number += header
    while max_rows is None or rows < max_rows:
        # Never a line past max_rows: a row is a line at least (blank lines are no rows).
        wanted = CHUNK_LINES if max_rows is None else min(CHUNK_LINES, max_rows - rows)
        lines += _lines(text, wanted - len(lines), line_number + len(lines), path)
        if not lines:
            break
        read += sum(map(len, lines))
        if read > MAX_TEXT_BYTES:
            raise DataError(f"{str(path)!r} holds more than {MAX_TEXT_BYTES / 2**30:.0f} GiB "
                            "of text, more than this reader takes")
        values = _parse(lines, line_number, len(cells), path)
        line_number, lines = line_number + len(lines), []
        if len(values):  # not blank lines only
            moments.add(values)
            targets.append(values[:, column].copy())
            for p in picking:
                p.take(values, rows, column)
            rows += len(values)
    if rows < 2:
        raise DataError(f"{str(path)!r} has {rows} data row{'s' * (rows != 1)}; a run needs at "
                        "least 2 (one to train, one to validate)")
    for p in picking:
        p.check_within(rows, path)
    return Table(names, column, np.concatenate(targets), moments, [p.out for p in picking])


def _first_row(text: TextIO, path: Path) -> tuple[int, str, int]:
    """(its line number, the first line that is not blank, the characters read so far)."""
    number, read = 1, 0
    while line := _line(text, number, path):
        read += len(line)
        if line.strip():
            return number, line, read
        number += 1
    raise DataError(f"{str(path)!r} holds no rows")


def _lines(text: TextIO, wanted: int, number: int, path: Path) -> list[str]:
    """Up to `wanted` lines of `text` (the first is line `number`), fewer at its end or
    once they hold CHUNK_CHARS characters: a chunk's size is bounded, whatever its lines'
    lengths."""
    lines, chars = [], 0
    while len(lines) < wanted and chars < CHUNK_CHARS:
        line = _line(text, number + len(lines), path)
        if not line:
            break
        lines.append(line)
        chars += len(line)
    return lines


def _line(text: TextIO, number: int, path: Path) -> str:
    """The next line of `text` ('' at its end), line `number` of the file: at most
    MAX_LINE_CHARS characters, read no further (one huge line is refused, not held)."""
    line = text.readline(MAX_LINE_CHARS + 1)
    if len(line) > MAX_LINE_CHARS:
        raise DataError(f"{str(path)!r} line {number} is longer than {MAX_LINE_CHARS:,} "
                        "characters: no table's row")
    return line


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _target_column(target: str, names: list[str] | None, columns: int, path: Path) -> int:
    if columns < 2:
        raise DataError(f"{str(path)!r} has {_columns(columns)}; it needs a target and at "
                        "least one feature")
    if names is not None and target in names:
        return names.index(target)
    try:
        index = int(target)
    except ValueError:
        if names is None:
            raise DataError(f"{str(path)!r} has no header row: --target takes a column "
                            f"number (0 to {columns - 1}), not {target!r}") from None
        shown = ", ".join(map(printable, names[:8])) + (", ..." if columns > 8 else "")
        raise DataError(f"{str(path)!r} has no column named {target!r} (its columns: "
                        f"{shown})") from None
    if not -columns <= index < columns:
        raise DataError(f"{str(path)!r} has no column {index}: its {columns} columns are "
                        f"0 to {columns - 1}")
    return index % columns


def _columns(n: int) -> str:
    return f"{n} column{'s' * (n != 1)}"


def _parse(lines: list[str], first: int, columns: int, path: Path) -> np.ndarray:
    """The numbers of `lines` (the first is line `first` of the file), (rows, columns)
    float64; blank lines are skipped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # only blank lines: no rows
            values = np.loadtxt(lines, delimiter=",", comments=None, dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise _unreadable(lines, first, columns, path, str(exc)) from None
    if values.size == 0:
        return np.empty((0, columns))
    if values.shape[1] != columns or not np.isfinite(values).all():
        raise _unreadable(lines, first, columns, path, "rows of other lengths")
    return values


def _unreadable(lines: list[str], first: int, columns: int, path: Path,
                parser_said: str) -> DataError:
    """The error of the first line of `lines` that is not `columns` finite numbers (only on
    the way to an error: Python's parsing, cell by cell)."""
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        cells = line.rstrip("\r\n").split(",")
        if len(cells) != columns:
            return DataError(f"{str(path)!r} line {number} has {_columns(len(cells))}, the "
                             f"first row {columns}")
        for column, cell in enumerate(cells):
            try:
                value = float(cell)
            except ValueError:
                return DataError(f"{str(path)!r} line {number}, column {column}: "
                                 f"{cell.strip()[:40]!r} is not a number")
            if not math.isfinite(value):
                return DataError(f"{str(path)!r} line {number}, column {column}: "
                                 f"{cell.strip()!r} is not a finite number")
    return DataError(f"{str(path)!r}: {parser_said.splitlines()[0]}")


class _Picking:
    """The rows one selection names, filled in as the chunks pass: the selection is sorted
    once, so each chunk finds its rows by binary search, not by a scan of the selection."""

    def __init__(self, selection: np.ndarray, features: int) -> None:
        self.order = np.argsort(selection, kind="stable")
        self.sorted = np.asarray(selection)[self.order]
        self.out = np.empty((len(selection), features), np.float32)

    def take(self, values: np.ndarray, start: int, target: int) -> None:
        lo, hi = np.searchsorted(self.sorted, [start, start + len(values)])
        rows = values[self.sorted[lo:hi] - start]
        self.out[self.order[lo:hi]] = np.delete(rows, target, axis=1)

    def check_within(self, rows: int, path: Path) -> None:
        if len(self.sorted) and self.sorted[-1] >= rows:
            raise DataError(f"{str(path)!r} now has {rows} rows, fewer than when the run's "
                            "data plan was made: did the file change?")


class CsvSource(Source):
    """The `csv` data set: a file's target column (--target) and the other columns as
    features, validated on a held-out share (--val-fraction).

    Features are always standardised, column by column, with the mean and standard deviation
    of every row: columns of a table come in units of their own, and SGD on them unscaled
    diverges or crawls. Every row, not
    the training rows alone, because the statistics come from the pass that reads the
    targets, before the split exists (as for any data set without a test part: ArraySource).
    The target is left as it is unless --standardise-target says otherwise (mse only).

    The file is read through once for the targets and statistics (`labels`, `check`), and
    once by each worker for its own rows (which fills in the statistics too)."""

    def __init__(self, settings) -> None:
        self.path, self.target = Path(settings.data_path), settings.target
        self.max_rows, self.standardise_target = settings.max_rows, settings.standardise_target
        self._table: Table | None = None

    def _read(self, *selections: np.ndarray) -> list[np.ndarray]:
        table = read_table(self.path, self.target, self.max_rows, selections)
        selected, table.selected = table.selected, []  # to the caller, not into the cache
        if self._table is None:
            self._table = table
        return selected

    def _found(self) -> Table:
        """The first pass's findings (reading the file through now if no pass has)."""
        if self._table is None:
            self._read()
        return self._table

    def check(self) -> None:
        self._found()

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._found().features,)

    @property
    def classes(self) -> int:
        """max + 1 of targets that are whole numbers from 0 (class ids for cross_entropy and
        bce); 1 for others (real values: one output)."""
        y = self._found().targets
        return int(y.max()) + 1 if y.min() >= 0 and (y == np.floor(y)).all() else 1

    @property
    def norm(self) -> Normalisation:
        mean, std = self._found().feature_moments()
        return Normalisation(tuple(mean.tolist()), tuple(std.tolist()))

    def labels(self) -> np.ndarray:
        table = self._found()
        if not self.standardise_target:
            return table.targets
        mean, std = table.moments.mean[table.target], table.moments.std()[table.target]
        return (table.targets - mean) / std

    def rows(self, *selections: np.ndarray) -> list[np.ndarray]:
        return self._read(*selections)


def load_csv(settings, seed: int) -> Source:
    return CsvSource(settings)
