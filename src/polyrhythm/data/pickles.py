"""Python-pickle archives (CIFAR's format), read without running anything they hold.

A pickle can name any importable callable and have the reader call it: `pickle.load` on a
file someone handed you runs their code. CIFAR's pickles need only dicts, lists, bytes,
numbers and numpy arrays, so the reader admits the few globals that rebuild an array and
nothing else; any other is a one-line DataError before anything is called.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from collections.abc import Iterator
from pathlib import Path

from polyrhythm.errors import DataError

# What numpy arrays (and their dtypes and scalars) pickle as, in numpy 1 and 2, and the
# function protocol-2 pickles from Python 3 store bytes through.
ALLOWED_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
})


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED_GLOBALS:
            raise DataError(f"refuses to unpickle {module}.{name}: a CIFAR pickle holds only "
                            "dicts, lists, bytes, numbers and numpy arrays")
        return super().find_class(module, name)


def restricted_loads(data: bytes, where: str) -> object:
    """Unpickle `data` (a member named `where`, for messages) admitting only built-in
    containers, bytes, numbers and numpy arrays."""
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    except Exception as exc:  # truncated or not a pickle: whatever the parser raised
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where} is not a readable pickle: {reason}") from None


def read_members(path: Path, members: list[str]) -> Iterator[tuple[str, dict]]:
    """(name, unpickled dict) of each named member, in the order given, from a .tar.gz
    archive or a directory (searched recursively), one at a time: only one member is in
    memory at once."""
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist")
    if path.is_dir():
        found = {p.name: p for p in path.rglob("*") if p.is_file()}
        _all_there(path, members, found)
        for name in members:
            try:
                data = found[name].read_bytes()
            except OSError as exc:
                raise DataError(f"cannot read {str(found[name])!r}: {exc.strerror}") from None
            yield name, _as_dict(restricted_loads(data, f"{str(path)!r} member {name}"), name)
        return
    try:
        with tarfile.open(path) as tar:
            by_name = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            _all_there(path, members, by_name)
            for name in members:
                data = tar.extractfile(by_name[name]).read()
                where = f"archive {str(path)!r} member {name}"
                yield name, _as_dict(restricted_loads(data, where), name)
    except (tarfile.TarError, EOFError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"cannot read archive {str(path)!r}: {reason} (neither a complete "
                        "tar archive nor a directory)") from None


def _all_there(path: Path, members: list[str], found: dict) -> None:
    missing = [m for m in members if m not in found]
    if missing:
        raise DataError(f"data path {str(path)!r} lacks {', '.join(missing)}")


def _as_dict(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise DataError(f"member {name} holds a {type(value).__name__}, not a dict of "
                        "data and labels")
    return value
