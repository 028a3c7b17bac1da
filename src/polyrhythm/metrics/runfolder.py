"""What a run's folder beside the store holds when the store could not be told how the run
ended (locked past its wait, a full disk): the reason, in a failed `summary.json`, and the
results of a run that trained to its end, in `unrecorded.json`, which `polyrhythm runs
--repair` records. Every file here is written whole or not at all (files.atomic_file), so
nothing half-written is left for a reader, and no `.partial` file stays behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from polyrhythm.errors import PolyrhythmError
from polyrhythm.files import NAME, atomic_file, read_regular

SUMMARY_FILE = "summary.json"
UNRECORDED_FILE = "unrecorded.json"
RESERVE_FILE = ".reserve"  # space held for the run's last words (see hold_reserve)
RESERVE_BYTES = 1 << 20
_NEARLY_FULL = 64 << 10
UNRECORDED = ("trained to its end, but the store could not record it: `polyrhythm runs "
              "--repair` records its kept results")
_READ_LIMIT = 1 << 20  # a summary is kilobytes; a larger file is not one


def write_atomically(path: Path, text: str) -> None:
    with atomic_file(path) as file:
        file.write(text.encode())


def write_json(path: Path, value) -> None:
    write_atomically(path, json.dumps(value, indent=2) + "\n")


def hold_reserve(folder: Path) -> None:
    """Set space aside in a run's folder for recording how it ends: a disk that fills
    during the run would otherwise leave no room for the store's row or the summary that
    says why it failed. Best effort: a disk already too full to hold it is found later."""
    path = Path(folder) / RESERVE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)


def release_reserve(folder: Path) -> None:
    """Give the reserve's space back, as the run's end is recorded (hold_reserve)."""
    with contextlib.suppress(OSError):
        (Path(folder) / RESERVE_FILE).unlink()


def full_disk(folder: Path) -> str:
    """" (the disk holding <folder> is full)" where it has (almost) no space left, else "":
    what a run that failed for want of space says, whatever error its processes met."""
    try:
        full = shutil.disk_usage(folder).free < _NEARLY_FULL
    except OSError:
        return ""
    return f" (the disk holding {str(folder)!r} is full)" if full else ""


def run_folder(store_dir: Path, run_id: str) -> Path | None:
    """The folder of run `run_id` beside a store in `store_dir`; None if the id is not a plain
    name (an id read from a store never becomes a path elsewhere)."""
    if not isinstance(run_id, str) or not NAME.fullmatch(run_id):
        return None
    return Path(store_dir) / run_id


def kept_reason(store_dir: Path, run_id: str) -> str | None:
    """Why a run ended, as its folder kept it where the store could not be told: UNRECORDED
    where its results wait to be recorded, else its failed summary's error; None if it kept
    nothing."""
    folder = run_folder(store_dir, run_id)
    if folder is None:
        return None
    if (folder / UNRECORDED_FILE).is_file():
        return UNRECORDED
    summary = read_json(folder / SUMMARY_FILE)
    error = summary.get("error") if isinstance(summary, dict) else None
    return error if isinstance(error, str) and summary.get("status") != "completed" else None


def read_json(path: Path, limit: int = _READ_LIMIT):
    """A JSON file's value, or None if it is missing, not a regular file (a named pipe would
    block the reader), unreadable, larger than `limit` bytes or not JSON."""
    try:
        return json.loads(read_regular(path, "file", PolyrhythmError, limit))
    except (PolyrhythmError, ValueError):
        return None
