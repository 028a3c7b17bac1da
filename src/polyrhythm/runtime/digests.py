"""Digests: each checkpoint file's SHA-256 beside it, so a resume trusts only bytes as written.

`<name>.sha256` beside `<name>` holds the SHA-256 of its bytes, in `sha256sum`'s format
(`sha256sum -c worker-0.pt.sha256`, run in the folder, checks one by hand). The digest is
taken while the file is written (`Digesting` hashes every byte on its way to the file: a
100 MB file is not read back), and written after it, atomically, by the rank that wrote the
file. Each rank writes digests of its own files only (model.pt's completion is claimed by
one rank), so ranks on hosts sharing a disk never write the same digest. A file written
again (model.pt completed with the servers' model, an epoch's snapshot redone) first has
its digest name both its old bytes and its new ones, then the new ones alone: whatever
moment a rank dies at, a file has no digest yet or a digest naming its bytes, and once a
checkpoint is complete it stays so. Where a file and its digest disagree, the bytes changed
after (a disk's fault, a copy's, a hand's), or the disk lost one of the two renames: either
way the file is not trusted.
"""

from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from polyrhythm.errors import DataError
from polyrhythm.files import atomic_file, open_regular, read_regular

SUFFIX = ".sha256"
_DIGEST_LIMIT = 64 << 10  # a digest file is a line or two
_LINE = re.compile(r"([0-9a-f]{64})  (\S+)$")


def of(path: Path) -> Path:
    """Where the digest of `path` is kept."""
    return path.with_name(path.name + SUFFIX)


class Digesting:
    """A binary file as torch.save writes to it, taking the SHA-256 of what passes."""

    def __init__(self, file: BinaryIO) -> None:
        self._file, self._hash = file, hashlib.sha256()

    def write(self, data) -> int:
        self._hash.update(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def kept(path: Path) -> list[str]:
    """The digests `path`'s digest file names (none if it has none, or cannot be read)."""
    try:
        lines = of(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [m.group(1) for line in lines if (m := _LINE.match(line))]


def keep(path: Path, hexdigests: list[str]) -> None:
    """Write `path`'s digest file: a line for each digest its bytes may have (the caller
    makes the folder's renames durable)."""
    with atomic_file(of(path)) as f:
        f.write("".join(f"{hexdigest}  {path.name}\n" for hexdigest in hexdigests).encode())


def has_digest(path: Path) -> bool:
    return of(path).is_file()


def problem(path: Path) -> str | None:
    """Why `path` is not to be trusted (no digest, unreadable, not the bytes its digest
    names), or None: its bytes are the ones written."""
    if not of(path).exists():
        return f"{path.name} has no digest"
    try:  # a named pipe in a file's place would block the reader forever: refused
        text = read_regular(of(path), "digest", DataError, _DIGEST_LIMIT).decode()
    except (DataError, UnicodeDecodeError) as exc:
        return f"{path.name}'s digest cannot be read ({exc})"
    named = [m.group(1) for line in text.splitlines() if (m := _LINE.match(line))]
    if not named:
        return f"{path.name}'s digest is not a SHA-256 line"
    if not path.exists():
        return f"{path.name} is missing"
    try:
        with open_regular(path, "checkpoint file", DataError) as f:
            actual = hashlib.file_digest(f, "sha256").hexdigest()
    except DataError as exc:
        return f"{path.name}: {exc}"
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    return None if actual in named else f"{path.name} does not match its digest"


def problems(paths: list[Path]) -> list[str | None]:
    """`problem` of each of `paths`, several at once (hashing lets go of the GIL): a resume
    checking every epoch's snapshot waits on the disk, not on one core."""
    if len(paths) < 2:
        return [problem(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(problem, paths))
