"""The files a user hands polyrhythm, opened safely, and the names a store holds, checked
before they name files.

Every file polyrhythm writes for a reader to find (a model, a summary, a checkpoint and its
digest) is written through atomic_file: whole or not at all.

Every file polyrhythm reads from a path it was given (a config, a sweep, a data set, a
run's script.json, a checkpoint) is opened here: without waiting (a named pipe opens at
once instead of blocking until someone writes to it), then refused unless it is a regular
file (a pipe would block, a device may never end, a folder is no file), and, where the reader
gives a limit, refused beyond it, by the size the file declares and again while it is read
(read_regular never reads more than the limit and a byte). Each failure is one line of the
reader's own error class (ConfigError for a config, DataError for data, ...).

A name read from a run store (a sweep id, a run id) becomes a folder's name: it must be
one plain name, never `..` or a path, or a damaged store would write (and remove) files
elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from polyrhythm.errors import PolyrhythmError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one folder name: no '/', no '..'
NAME_CHARS = "letters, digits, '.', '_' and '-', starting with a letter or digit"
_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory",
          stat.S_IFSOCK: "a socket"}


def shown(value: object, limit: int = 80) -> str:
    """A value as a one-line message shows it: its repr (which escapes line breaks), cut
    after `limit` characters."""
    try:
        text = repr(value)
    except ValueError:  # an integer of more than 4,300 digits
        return "a number too long to show"
    return text if len(text) <= limit else text[:limit] + "..."


def printable(text: str) -> str:
    """`text` as it is, or its repr if it holds a character that breaks a line or does not
    print (a file's own names in a one-line message)."""
    return text if text.isprintable() else repr(text)


def size_text(size: int) -> str:
    """Bytes as a message says them: "12 bytes", "3.0 MiB", "2.5 GiB"."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def open_regular(path: str | os.PathLike, what: str, error: type[PolyrhythmError],
                 limit: int | None = None) -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file that declares at most
    `limit` bytes (any size if None); else a one-line `error` that starts with `what`
    ("config file"). A reader that must not read past the limit either (a file may grow
    while read) counts what it reads: read_regular does."""
    name = repr(str(path))  # whole: a path is the user's to find
    try:
        # O_NONBLOCK: opening a named pipe for reading would wait for a writer, forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"cannot read {what} {name}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a path no file can have: "embedded null byte"
        raise error(f"cannot read {what} {name}: {exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a file")
            raise error(f"cannot read {what} {name}: it is {kind}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise error(f"{what} {name} holds {size_text(info.st_size)}, more than the "
                        f"{size_text(limit)} it may")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, what: str, error: type[PolyrhythmError],
                 limit: int) -> bytes:
    """The bytes of `path` (see open_regular): a regular file of at most `limit` bytes, by
    its declared size and by what is read (never more than `limit` + 1 bytes)."""
    with open_regular(path, what, error, limit) as stream:
        try:
            data = stream.read(limit + 1)
        except OSError as exc:
            raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{what} {str(path)!r} grew past {size_text(limit)} while it was "
                    "read")
    return data


def checked_name(name: object, what: str, error: type[PolyrhythmError]) -> str:
    """`name` if it can name one folder (NAME); else a one-line `error` saying what it is
    (`what`: "sweep id", "run id")."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise error(f"{what} {shown(name)} cannot name a folder: it must be {NAME_CHARS}")
    return name


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike,
                before_rename: Callable[[], None] | None = None) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: flushed to disk, then renamed over `path`, so a
    reader sees the previous file (or none) or the whole new one; removed if writing fails (a
    full disk, a kill's KeyboardInterrupt), so no partial file stays. Its own name, by host
    and process: several ranks, on hosts sharing a disk, may write one path at once.
    `before_rename` runs once the bytes are on disk and before they replace the old ones (a
    checkpoint's digest then vouches for either)."""
    path = os.fspath(path)
    partial = f"{path}.{socket.gethostname()}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
