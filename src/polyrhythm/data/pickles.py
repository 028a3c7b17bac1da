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
from polyrhythm.files import open_regular, printable, read_regular, size_text

# CIFAR-100's training member, the largest, is 155 MB: a member declared larger is no CIFAR
# member, and is refused before it is read (a compressed one may inflate to any size).
MAX_MEMBER_BYTES = 256 * 2**20
MAX_ARCHIVE_BYTES = 2**30  # the files of an archive together (CIFAR's: 180 MB)

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
            raise DataError(f"refuses to unpickle {printable(f'{module}.{name}')}: a CIFAR "
                            "pickle holds only dicts, lists, bytes, numbers and numpy arrays")
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
    memory at once, and none larger than MAX_MEMBER_BYTES."""
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist")
    if path.is_dir():
        found = {p.name: p for p in path.rglob("*") if p.is_file()}
        _all_there(path, members, found)
        for name in members:
            data = read_regular(found[name], "data file", DataError, MAX_MEMBER_BYTES)
            yield name, _as_dict(restricted_loads(data, f"{str(path)!r} member {name}"), name)
        return
    try:
        with (open_regular(path, "data file", DataError) as raw,
              tarfile.open(fileobj=raw) as tar):
            by_name = _archive_members(tar, path)
            _all_there(path, members, by_name)
            for name in members:
                where = f"archive {str(path)!r} member {name}"
                _check_size(by_name[name].size, where)
                # tarfile reads a member's declared size, no more.
                data = tar.extractfile(by_name[name]).read()
                yield name, _as_dict(restricted_loads(data, where), name)
    except (tarfile.TarError, EOFError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"cannot read archive {str(path)!r}: {reason} (neither a complete "
                        "tar archive nor a directory)") from None


def _archive_members(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    """The archive's files by name, from their headers, read one at a time: the sizes they
    declare stop the reading once they pass MAX_ARCHIVE_BYTES together (finding the next
    header in a compressed archive inflates everything before it)."""
    files, declared = {}, 0
    for member in tar:
        if member.isfile():
            files[Path(member.name).name] = member
            declared += member.size
            if declared > MAX_ARCHIVE_BYTES:
                raise DataError(f"archive {str(path)!r} declares more than "
                                f"{size_text(MAX_ARCHIVE_BYTES)} of files: no CIFAR archive")
    return files


def _check_size(size: int, where: str) -> None:
    if size > MAX_MEMBER_BYTES:
        raise DataError(f"{where} declares {size_text(size)}, more than the "
                        f"{size_text(MAX_MEMBER_BYTES)} a CIFAR member may hold")


def _all_there(path: Path, members: list[str], found: dict) -> None:
    missing = [m for m in members if m not in found]
    if missing:
        raise DataError(f"data path {str(path)!r} lacks {', '.join(missing)}")


def _as_dict(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise DataError(f"member {name} holds a {type(value).__name__}, not a dict of "
                        "data and labels")
    return value
