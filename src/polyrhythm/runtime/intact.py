"""Which checkpoint a resume trusts: the newest whose every file is the bytes once written,
as are the model snapshots of the epochs it has done; whatever it passes over is set aside.

`latest` goes from the newest checkpoint folder back and takes the first that is complete
(checkpoint.needed), whose every `.pt` file matches its digest (runtime/digests.py), and whose
epochs' snapshots match theirs, so a damaged snapshot stops the resume before training, not
at validation after it. Every folder it passes over is newer than the one taken, so the
resumed run writes into its name again: left there, the failed run's files (a server's, say)
would complete it later with stale state. Each is moved, as is a damaged snapshot, to
`checkpoints/set-aside/<what>-<why>`, never loaded again and never deleted (remove them once
looked at), and one line says so.

A checkpoint without any digest, written by polyrhythm before digests were kept, is judged as
it was then: complete when its files are there, usable when each loads. A snapshot without a
digest (such a run's) is taken as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from polyrhythm.errors import DataError, StoreError, one_line
from polyrhythm.runtime import digests
from polyrhythm.runtime.checkpoint import (
    FOLDER,
    SNAPSHOTS,
    Resume,
    epoch_dir,
    epoch_folders,
    load,
    needed,
)

SET_ASIDE = "set-aside"
_SNAPSHOT = re.compile(r"worker-\d+-epoch-(\d{4,})\.pt$")


def latest(run_dir: Path, workers: int, servers: int, say=print) -> tuple[Resume, int]:
    """The newest checkpoint a resume can trust, and its epochs completed; each one newer is
    set aside, and `say` says why in a line. One-line DataError if none is left."""
    snapshots = _Snapshots(Path(run_dir), say)
    for epochs_done in reversed(epoch_folders(run_dir)):
        folder = epoch_dir(run_dir, epochs_done)
        why = _untrusted(folder, workers, servers) or snapshots.damaged_before(epochs_done)
        if why is None:
            return Resume.at(folder), epochs_done
        tag, words = why
        where = set_aside([folder], Path(run_dir), f"{folder.name}-{tag}")
        say(f"checkpoint after epoch {epochs_done} {words}: set aside in {str(where)!r}; "
            "trying the one before it")
    raise DataError(f"no usable checkpoint in {str(Path(run_dir) / FOLDER)!r}: the run "
                    "cannot be resumed")


def set_aside(paths: list[Path], run_dir: Path, label: str) -> Path:
    """Move `paths` (a checkpoint folder; a file and its digest) out of the resume's way, into
    `checkpoints/set-aside/<label>` (`label-2`... if taken): one rename each, on the same
    disk. Where that cannot be, a one-line StoreError: left in place, they could be loaded."""
    root = run_dir / FOLDER / SET_ASIDE
    try:
        root.mkdir(exist_ok=True)
        where, n = root / label, 1
        while where.exists():
            n += 1
            where = root / f"{label}-{n}"
        if len(paths) == 1 and paths[0].is_dir():
            os.rename(paths[0], where)
            return where
        where.mkdir()
        for path in paths:
            if path.exists():
                os.rename(path, where / path.name)
    except OSError as exc:
        raise StoreError(f"cannot set aside {str(paths[0])!r} ({exc.strerror or exc}): it "
                         "would be loaded by a later resume; move it away by hand") from exc
    return where


def _untrusted(folder: Path, workers: int, servers: int) -> tuple[str, str] | None:
    """Why the checkpoint in `folder` cannot be trusted (a tag for its set-aside name, and
    words for a line), or None."""
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError as exc:
        return "unreadable", f"cannot be read ({exc.strerror or exc})"
    missing = sorted(needed(names, workers, servers) - names)
    if missing:
        return "incomplete", f"is incomplete (no {missing[0]})"
    files = sorted(name for name in names if name.endswith(".pt"))
    if any(name.endswith(digests.SUFFIX) for name in names):
        found = [p for p in digests.problems([folder / name for name in files]) if p]
        return ("damaged", f"is damaged ({found[0]})") if found else None
    for name in files:  # written without digests: trusted if it loads, as it was then
        try:
            load(folder / name)
        except Exception as exc:  # truncated or corrupted: whatever torch.load raised
            return "damaged", f"is unreadable ({name}: {one_line(exc) or type(exc).__name__})"
    return None


class _Snapshots:
    """The run's epoch snapshots (every worker's that wrote them), each checked against its
    digest once, as the checkpoints that need it come up; a damaged one is set aside."""

    def __init__(self, run_dir: Path, say) -> None:
        self._run_dir, self._say = run_dir, say
        root = run_dir / FOLDER / SNAPSHOTS
        found = sorted((int(m.group(1)), p) for p in root.glob("*.pt")
                       if (m := _SNAPSHOT.match(p.name))) if root.is_dir() else []
        self._unchecked = [(e, p) for e, p in found if digests.has_digest(p)]
        self._damaged: list[int] = []  # epochs (from 0) with a damaged snapshot

    def damaged_before(self, epochs_done: int) -> tuple[str, str] | None:
        """Why a checkpoint after `epochs_done` epochs cannot be used for its snapshots (of
        epochs 0 to epochs_done - 1), or None."""
        due = [(e, p) for e, p in self._unchecked if e < epochs_done]
        self._unchecked = [(e, p) for e, p in self._unchecked if e >= epochs_done]
        for (epoch, path), problem in zip(due, digests.problems([p for _, p in due]),
                                          strict=True):
            if problem:
                where = set_aside([path, digests.of(path)], self._run_dir,
                                  f"{SNAPSHOTS}-{path.stem}-damaged")
                self._say(f"epoch {epoch + 1}'s model snapshot is damaged ({problem}): set "
                          f"aside in {str(where)!r}")
                self._damaged.append(epoch)
        damaged = [e for e in self._damaged if e < epochs_done]
        if not damaged:
            return None
        return ("snapshot-damaged",
                f"needs epoch {min(damaged) + 1}'s model snapshot, which is damaged")
