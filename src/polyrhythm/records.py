"""A run's record: its directory (config.toml, summary.json, model.pt, logs/) and store rows."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from polyrhythm.errors import StoreError
from polyrhythm.metrics.store import RunStore
from polyrhythm.summary import RunResult

STORE_NAME = "polyrhythm.db"


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


def start_run(config) -> RunRecord:
    """Create the run's directory and its 'running' row, before any process starts."""
    now = datetime.now(UTC)
    run_id = f"{now:%Y%m%d-%H%M%S}-{config.strategy}-{secrets.token_hex(3)}"
    record = RunRecord(Path(config.out), run_id)
    toml = config.to_toml()
    try:
        (record.dir / "logs").mkdir(parents=True)
        (record.dir / "config.toml").write_text(toml)
    except OSError as exc:
        raise StoreError(f"cannot write run directory {str(record.dir)!r}: "
                         f"{exc.strerror}") from None
    record.store.add_run(run_id, now.isoformat(timespec="seconds"), config, toml)
    return record


def complete_run(record: RunRecord, result: RunResult) -> dict:
    """Write summary.json and model.pt, mark the run completed; return the full summary."""
    summary = {"run_id": record.run_id, **result.summary, "run_dir": str(record.dir)}
    torch.save(result.state_dict, record.dir / "model.pt")
    summary["epoch_metrics"] = result.epochs
    (record.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    record.store.complete_run(record.run_id, summary, result.epochs, result.series)
    return summary


def fail_run(record: RunRecord, error: str) -> None:
    """Mark the run failed with a one-line reason (the summary says so too). A run whose
    results are already recorded stays completed."""
    if not record.store.fail_run(record.run_id, error):
        return
    summary = {"run_id": record.run_id, "status": "failed", "error": error,
               "run_dir": str(record.dir)}
    (record.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def summary_json_line(summary: dict) -> str:
    """The summary as one JSON line (per-epoch metrics left out: they are in summary.json)."""
    return json.dumps({k: v for k, v in summary.items() if k != "epoch_metrics"})


def read_summary(record: RunRecord) -> dict:
    return json.loads((record.dir / "summary.json").read_text())
