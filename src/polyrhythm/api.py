"""The Python API: `polyrhythm.train(config)` runs a job on this machine (on loopback, or on an
emulated cluster when the config has hosts) and returns its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrhythm.config import RunConfig, layered, load_config
from polyrhythm.data.datasets import open_source
from polyrhythm.launch.cluster import can_emulate
from polyrhythm.launch.emulated import launch_emulated
from polyrhythm.launch.local import launch_local
from polyrhythm.launch.progress import ProgressBoard
from polyrhythm.metrics.records import measured_compute, start_run


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
    """Train one job on this machine and return its summary (also stored under config.out):
    on loopback, or on an emulated cluster of `hosts` network namespaces.

    Raises ConfigError/DataError for bad input (before any run is recorded) and RunFailed if
    a process of the job fails (the run is then stored as failed).
    """
    config = resolve_config(config, **overrides)
    # Fail on what is missing or unsafe (data, a run to replay, root for a cluster) before a
    # run record exists; the data is read through, not kept (workers read their shards).
    open_source(config.data, config.seed).check()
    if config.compute_from is not None:
        measured_compute(config.out, config.compute_from)
    if config.cluster.hosts:
        can_emulate()
        return launch_emulated(config, start_run(config), show_progress)
    record = start_run(config)
    board = ProgressBoard(config.workers, enabled=True) if show_progress else None
    return launch_local(config, record, board)
