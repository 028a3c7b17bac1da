"""The Python API: `polyrhythm.train(config)` runs a job locally and returns its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrhythm.config import RunConfig, layered, load_config
from polyrhythm.data.datasets import load_dataset
from polyrhythm.launch.local import launch_local
from polyrhythm.launch.progress import ProgressBoard
from polyrhythm.metrics.records import start_run


def resolve_config(config: RunConfig | dict | str | Path | None = None,
                   **overrides: Any) -> RunConfig:
    """A RunConfig from a RunConfig, a dict (flat keys, sections or both) or a TOML path, plus
    overrides."""
    if isinstance(config, RunConfig):
        # Only what the caller set: resolved defaults (servers) follow the new strategy.
        return RunConfig(**layered(config.given, overrides))
    if isinstance(config, dict):
        return RunConfig(**layered(config, overrides))
    return load_config(config, **overrides)


def train(config: RunConfig | dict | str | Path | None = None, *, show_progress: bool = False,
          **overrides: Any) -> dict:
    """Train one job on this machine and return its summary (also stored under config.out).

    Raises ConfigError/DataError for bad input (before any run is recorded) and RunFailed if
    a process of the job fails (the run is then stored as failed).
    """
    config = resolve_config(config, **overrides)
    load_dataset(config.data, config.seed)  # fail on missing data before a run record exists
    record = start_run(config)
    board = ProgressBoard(config.workers, enabled=True) if show_progress else None
    return launch_local(config, record, board)
