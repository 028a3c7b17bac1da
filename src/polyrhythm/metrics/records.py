"""A run's record: its directory (config.toml, summary.json, model.pt, logs/) and store rows.

Torch-free, like the store: listing and reporting runs loads no runtime.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polyrhythm.errors import StoreError, one_line
from polyrhythm.metrics.launcher import read_identity
from polyrhythm.metrics.runfolder import (
    SUMMARY_FILE,
    UNRECORDED_FILE,
    hold_reserve,
    read_json,
    release_reserve,
    run_folder,
    write_json,
)
from polyrhythm.metrics.store import RunStore, process_identity

STORE_NAME = "polyrhythm.db"
MODEL_NAME = "model.pt"
_KEPT_LIMIT = 1 << 30  # a run's kept results: its summary, epochs and event series


@dataclass(frozen=True)
class RunRecord:
    """Where one run is recorded. Any process can rebuild it from (out, run_id)."""

    out: Path
    run_id: str

    @property
    def dir(self) -> Path:
        return self.out / self.run_id

    @property
    def store(self) -> RunStore:
        return RunStore(self.out / STORE_NAME)

    def log_path(self, rank: int) -> Path:
        return self.dir / "logs" / f"rank{rank}.log"

    @property
    def model_path(self) -> Path:
        return self.dir / MODEL_NAME


def start_run(config, script: str | None = None) -> RunRecord:
    """Create the run's directory and its 'running' row, before any process starts. The row
    names this process as the run's launcher: should it die without recording the run's end
    (SIGKILL), the next listing of the store shows the run `failed` (`launcher gone`).

    `config` is the RunConfig: its `out`, `columns()` (the store's headline columns) and
    `to_toml()` are what the record needs. A user's `script` brings its own data and model:
    the row says "script" and the script's file name for them, not the config's defaults,
    which the script never read."""
    now = datetime.now(UTC)
    columns = config.columns()
    if script is not None:
        columns |= {"dataset": "script", "model": Path(script).name}
    run_id = f"{now:%Y%m%d-%H%M%S}-{columns['strategy']}-{secrets.token_hex(3)}"
    record = RunRecord(Path(config.out), run_id)
    toml = config.to_toml(script=script is not None)  # what a script's job reads
    private = not getattr(config, "shared_perms", False)
    try:
        make_folders(record.dir, private)
        try:
            (record.dir / "config.toml").write_text(toml)
            hold_reserve(record.dir)
            record.store.add_run(run_id, now.isoformat(timespec="seconds"), columns, toml,
                                 launcher=process_identity(), private=private)
        except BaseException:
            # A run the store never took (one this user may not write, or not a store at
            # all) leaves no directory behind either.
            shutil.rmtree(record.dir, ignore_errors=True)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write run directory {str(record.dir)!r}: "
                         f"{exc.strerror}") from None
    return record


def make_folders(run_dir: Path, private: bool) -> None:
    """A new run's folder and its logs/ (and the store's folder, if new): its owner's alone
    (0700) where `private`, else as the umask allows. Everything the run writes lies inside:
    its model, checkpoints, logs and summary are unreadable to others without a mode of
    their own."""
    mode = 0o700 if private else 0o777
    run_dir.parent.mkdir(parents=True, exist_ok=True, mode=mode)
    run_dir.mkdir(mode=mode)
    (run_dir / "logs").mkdir(mode=mode)


def complete_run(record: RunRecord, summary: dict, epochs: list[dict],
                 series: dict[str, list[tuple]]) -> dict:
    """Mark the run completed in the store with its summary, epochs and event series, then
    write summary.json (the model is written beside it by whoever holds it, before); return
    the full summary. The store is told first: nobody reads "completed" the store does not
    hold. A store that cannot take them (locked past its wait, a full disk) leaves the
    results in the run's folder for `polyrhythm runs --repair`, and a one-line StoreError."""
    summary = {"run_id": record.run_id, **summary, "run_dir": str(record.dir),
               "epoch_metrics": epochs}
    release_reserve(record.dir)
    try:
        record.store.complete_run(record.run_id, summary, epochs, series)
    except StoreError as exc:
        raise _kept_unrecorded(record, summary, epochs, series, exc) from None
    try:
        write_json(record.dir / SUMMARY_FILE, summary)
    except OSError as exc:  # the store holds the run: its copy in the folder is a convenience
        print(f"polyrhythm: warning: {SUMMARY_FILE} of run {record.run_id} not written "
              f"({exc.strerror}); the store holds its summary", file=sys.stderr)
    return summary


def _kept_unrecorded(record: RunRecord, summary: dict, epochs: list[dict],
                     series: dict[str, list[tuple]], exc: StoreError) -> StoreError:
    """Keep a completed run's results that the store refused (`exc`) in its folder; the
    one-line error that says so and how to record them."""
    kept = record.dir / UNRECORDED_FILE
    try:
        write_json(kept, {"summary": summary, "epochs": epochs, "series": series})
    except OSError as error:
        return StoreError(f"run {record.run_id} trained to its end, but the store could not "
                          f"record it ({exc}) and its results could not be kept either "
                          f"({error.strerror})")
    return StoreError(f"run {record.run_id} trained to its end, but the store could not "
                      f"record it ({exc}); its results are kept in {str(kept)!r}: "
                      f"`polyrhythm runs --repair --out {record.out}` records them")


def repair_runs(out: str | Path) -> list[str]:
    """Record in the store under `out` the results its runs kept when it could not take them
    (`unrecorded.json`: see complete_run); the ids of the runs now completed. A run whose
    launcher still runs is left alone; a kept file that is not a run's results is a one-line
    StoreError."""
    store = RunStore(Path(out) / STORE_NAME)
    repaired = []
    for run in store.runs():
        folder = run_folder(store.path.parent, run["run_id"])
        if run["status"] == "running" or folder is None:
            continue
        kept_path = folder / UNRECORDED_FILE
        if not kept_path.is_file():
            continue
        kept = read_json(kept_path, limit=_KEPT_LIMIT)
        try:
            summary, epochs, series = kept["summary"], kept["epochs"], kept["series"]
            if run["status"] != "completed":
                store.complete_run(run["run_id"], summary, epochs, series)
        except (TypeError, KeyError, ValueError):
            raise StoreError(f"{str(kept_path)!r} is not a run's kept results") from None
        write_json(folder / SUMMARY_FILE, summary)
        kept_path.unlink()
        repaired.append(run["run_id"])
    return repaired


def fail_run(record: RunRecord, error: str, status: str = "failed") -> None:
    """Mark the run failed (or `diverged`) with a one-line reason (the summary says so
    too). A run whose results are already recorded stays completed. A store that cannot be
    told leaves the reason in the run's summary.json, where a listing of the store finds it
    (metrics/runfolder.py), and raises a one-line StoreError that gives it."""
    summary = {"run_id": record.run_id, "status": status, "error": error,
               "run_dir": str(record.dir)}
    release_reserve(record.dir)
    try:
        if not record.store.fail_run(record.run_id, error, status):
            return
    except StoreError as exc:
        with contextlib.suppress(OSError):
            write_json(record.dir / SUMMARY_FILE, summary)
        raise StoreError(f"{error}; the store could not record this ({exc})") from None
    write_json(record.dir / SUMMARY_FILE, summary)


def check_resumable(record: RunRecord) -> None:
    """A one-line StoreError unless the run may be resumed: failed (or diverged), or left
    `running` by a launcher that is gone (SIGKILL), which is first marked failed as a listing
    would mark it. A run whose launcher lives is refused: two launchers on one run would each
    start its ranks."""
    store = record.store
    store.fail_orphans(record.run_id)
    run = store.run(record.run_id)
    if run is None:
        raise StoreError(f"no run {record.run_id!r} in {str(store.path)!r}")
    if run["status"] in ("failed", "diverged"):
        return
    if run["status"] == "running":
        launcher = read_identity(run["launcher"]) or {}
        by = (f" by process {launcher.get('pid')} on {launcher.get('host')}, which is not "
              "gone" if launcher else "")
        raise StoreError(f"run {record.run_id} is still running{by}: only a failed or "
                         "interrupted run can be resumed")
    raise StoreError(f"run {record.run_id} is {run['status']}: only a failed or interrupted "
                     "run can be resumed")


def reopen_run(record: RunRecord) -> None:
    """A failed run being resumed: running again, in the same record. One-line StoreError
    if it is not failed (completed: nothing to resume; running: another process has it)."""
    if not record.store.reopen_run(record.run_id, launcher=process_identity()):
        raise StoreError(f"run {record.run_id} is not a failed run: only a failed or "
                         "interrupted run can be resumed")
    hold_reserve(record.dir)


def summary_json_line(summary: dict) -> str:
    """The summary as one JSON line (per-epoch metrics left out: they are in summary.json)."""
    return json.dumps({k: v for k, v in summary.items() if k != "epoch_metrics"})


def recorded_summary(record: RunRecord) -> dict | None:
    """The run's summary as the store holds it once completed (what a launcher reports);
    None until then."""
    run = record.store.run(record.run_id)
    if run is None or run["status"] != "completed" or not run["summary"]:
        return None
    return json.loads(run["summary"])


def read_summary(record: RunRecord) -> dict:
    """The completed run's summary from the store: a one-line StoreError if the store does
    not hold it completed (its ranks ended, yet nothing reached the store)."""
    summary = recorded_summary(record)
    if summary is None:
        raise StoreError(f"run {record.run_id} ended without its results recorded in the "
                         "store")
    return summary


# How a run's config is stored: general settings at the top, then sections; the sections
# that name a component, and the flat key that names it (`dataset = "digits"` is
# [data] name = "digits").
NAME_KEYS = {"strategy": "strategy", "data": "dataset", "model": "model",
             "compression": "compress"}
SECTIONS = (*NAME_KEYS, "optimizer", "cluster")

# polyrhythm 0.1 stored every field flat, the synthetic data set's included whatever the data
# set was.
_RELEASE_0_1 = {"strategy", "workers", "servers", "epochs", "batch_size", "lr", "momentum",
                "async_momentum_correction", "weight_decay", "lr_decay_every", "lr_decay",
                "dataset", "synthetic_shape", "synthetic_classes", "synthetic_size",
                "val_fraction", "model", "seed", "worker_delay_s", "warmup_steps",
                "instrumentation", "out"}


def from_release_0_1(values: dict[str, Any]) -> dict[str, Any]:
    """A config.toml written by polyrhythm 0.1 (every field, flat) without the settings its
    data set does not read; any other config as it is."""
    if not values.keys() >= _RELEASE_0_1 or values["dataset"] == "synthetic":
        return values
    return {k: v for k, v in values.items() if not k.startswith("synthetic_")}


def flatten(values: dict[str, Any]) -> dict[str, Any]:
    """A config in sections (or flat, or both) as flat keys: `strategy`, `dataset`, `tau`,
    `lr`, ... A component inside another (a composed strategy's half) stays a table."""
    fields: dict[str, Any] = {}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                fields[NAME_KEYS[key] if k == "name" else k] = v
        else:
            fields[key] = value
    return from_release_0_1(fields)


def config_fields(config_toml: str, run_id: str = "a run") -> dict[str, Any]:
    """A stored config as flat fields, whether written in sections or by polyrhythm 0.1; a
    one-line StoreError naming `run_id` if it is not TOML."""
    try:
        return flatten(tomllib.loads(config_toml))
    # ValueError: an integer of more than 4,300 digits; RecursionError: arrays nested deep
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        reason = one_line(exc) or "nested too deeply"
        raise StoreError(f"{run_id}'s stored config is not TOML ({reason})") from None


def compression_section(config_toml: str | None) -> dict[str, Any]:
    """A stored config's [compression] section: the compressor's name and the settings it
    was given. {} where nothing was compressed (such a config, and any written before
    compressors existed, has no section) or the text is not TOML."""
    try:
        section = tomllib.loads(config_toml or "").get("compression")
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(section, dict) or section.get("name", "none") == "none":
        return {}
    return section


def compression_label(section: dict[str, Any]) -> str:
    """What a run compressed with, in a few words: "none", or the compressor's name and the
    settings its section holds ("topk ratio=0.01", "powersgd rank=4 warm_start=true")."""
    if not section:
        return "none"

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return f"{value:g}" if isinstance(value, float) else str(value)

    return " ".join([str(section["name"]),
                     *(f"{k}={text(v)}" for k, v in section.items() if k != "name")])


def completed_run(out: str | Path, run_id: str, asker: str) -> tuple[RunStore, dict]:
    """The store under `out` and its row of completed run `run_id`; a one-line StoreError
    (starting with `asker`, the setting or flag that named it) if it is not there."""
    store = RunStore(Path(out) / STORE_NAME)
    run = store.run(run_id) if store.path.exists() else None
    if run is None:
        raise StoreError(f"{asker}: no run {run_id!r} in {str(store.path)!r}")
    if run["status"] != "completed":
        raise StoreError(f"{asker}: run {run_id} is {run['status']}, not completed")
    return store, run


def measured_compute(out: str | Path, run_id: str) -> list[list[float]]:
    """The compute seconds of every step a stored run measured, per worker in step order:
    what emulated compute replays (compute_from)."""
    store, run = completed_run(out, run_id, "compute_from")
    return compute_series(store.series("iterations", run_id), run, "compute_from")


def compute_series(rows: list, run: dict, asker: str) -> list[list[float]]:
    """Per worker in step order, the compute seconds of a run's iteration rows (checked
    rows: metrics/rows.py); a one-line StoreError (starting with `asker`) if the run kept
    none, or rows its workers cannot have written."""
    times: dict[int, list[tuple[int, float]]] = {}
    for row in rows:
        if row["worker"] >= run["workers"] or row["compute_s"] < 0:
            raise StoreError(f"{asker}: run {run['run_id']}'s iterations are damaged: a row "
                             f"of worker {row['worker']} (of {run['workers']}) took "
                             f"{row['compute_s']} s")
        times.setdefault(row["worker"], []).append((row["step"], row["compute_s"]))
    if len(times) < run["workers"]:  # not range(workers): a damaged count may be huge
        raise StoreError(f"{asker}: run {run['run_id']} recorded no per-step times (it ran "
                         "with instrumentation off)")
    return [[seconds for _, seconds in sorted(times[w])] for w in range(run["workers"])]


def amend_run(record: RunRecord, extra: dict) -> dict:
    """Add `extra` to a completed run's summary (summary.json and the store); return it."""
    summary = read_summary(record) | extra
    record.store.amend_summary(record.run_id, summary)
    write_json(record.dir / SUMMARY_FILE, summary)
    return summary
