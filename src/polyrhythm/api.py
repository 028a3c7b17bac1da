"""The Python API: `polyrhythm.train(config)` runs a job on this machine (on loopback, or on an
emulated cluster when the config has hosts) and returns its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrhythm.config import RunConfig, layered, load_config, unread_by_a_script
from polyrhythm.config.spark import check_spark_settings
from polyrhythm.data.datasets import open_source
from polyrhythm.data.plan import check_split
from polyrhythm.data.splitters import splitter
from polyrhythm.errors import ConfigError
from polyrhythm.launch.launchers.registry import launcher_of
from polyrhythm.launch.launchers.script_launcher import ScriptCall
from polyrhythm.launch.process import runlock
from polyrhythm.losses import LOSSES
from polyrhythm.metrics.records import (
    RunRecord,
    check_resumable,
    measured_compute,
    reopen_run,
    start_run,
)
from polyrhythm.models.build import check_model
from polyrhythm.runtime.checkpoint import Resume
from polyrhythm.runtime.intact import latest


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
    check_spark_settings(config)
    # Fail on what is missing, unsafe or mismatched (data, targets the loss cannot take, a
    # model that cannot take its samples or whose output does not fit the loss, a user's
    # splitter that cannot be imported, a run to replay, root for a cluster) before a run
    # record exists; the data is read through, not kept (workers read their shards).
    source = open_source(config.data, config.seed)
    source.check()
    labels = LOSSES[config.loss].targets(source.labels(), source.classes,
                                         f"dataset {config.data.name}")
    check_model(config.model, source.shape, source.classes, config.loss)
    check_split(len(labels), source.given_val, config.data, config.batch_size)
    splitter(config.data.sharding or "random")
    if config.compute_from is not None:
        measured_compute(config.out, config.compute_from)
    launcher = launcher_of(config)
    launcher.check(config, source)
    return launcher.train(config, start_run(config), show_progress)


def run_script(script: str | Path, args: list[str] | None = None,
               config: RunConfig | dict | str | Path | None = None, **overrides: Any) -> dict:
    """Run a user's training script (one that calls polyrhythm.init()) as every rank of a
    job on this machine (on loopback, or on an emulated cluster when the config has hosts);
    return the run's summary. Its data and model are the script's: the config gives the
    strategy, workers, servers, cluster and the rest. Worker 0's output is shown."""
    config = resolve_config(config, **overrides)
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"no script {str(script)!r}")
    check_spark_settings(config)
    if unread := unread_by_a_script(config):
        raise ConfigError(f"{' and '.join(unread)} set polyrhythm train's own job; a script's "
                          "batch size, data, model and loss are its own (its loader's "
                          "batch_size, ...): drop " + ("them" if len(unread) > 1 else "it"))
    launcher = launcher_of(config)
    launcher.check(config, script=True)
    if config.compute_from is not None:  # the run to replay, before this one is recorded
        measured_compute(config.out, config.compute_from)
    record, call = start_run(config, script=str(path)), ScriptCall.here(path, list(args or []))
    return launcher.script(config, record, call)


# What a resumed run may change: the servers (the flat model is re-sliced), and how long and
# how often it checkpoints. Anything else would make it another run. A script's epochs are
# the script's own (job.epochs(n)).
RESUMABLE = {"servers", "epochs", "checkpoint_every"}
SCRIPT_RESUMABLE = RESUMABLE - {"epochs"}


def resume(run_id: str, out: str | Path = "runs", *, show_progress: bool = False,
           say=print, **overrides: Any) -> dict:
    """Carry on a failed or interrupted run from its newest usable checkpoint, to its
    configured epochs, in the same run record; return its summary as `train` does. A run
    whose launcher died without recording its end (SIGKILL) counts as failed."""
    record = _stored_run(run_id, out)
    call = ScriptCall.recalled(record.dir)
    if call is not None:
        raise ConfigError(f"run {run_id} is a script run ({Path(call.script).name}): resume "
                          f"it with `polyrhythm run --resume {run_id}`")
    config, point, done = _reopened(record, out, overrides, RESUMABLE, say)
    say(f"resuming run {run_id} after epoch {done} of {config.epochs}")
    return launcher_of(config).train(config, record, show_progress, resume=point)


def resume_script(run_id: str, out: str | Path = "runs", *, say=print,
                  **overrides: Any) -> dict:
    """Carry on a failed or interrupted script run (`run_script`) as `resume` does a
    built-in job's: its script, with its arguments, from the folder it ran in, started again
    from the newest usable checkpoint; its workers load their state as the script's
    `job.epochs(n)` begins and go on after the last epoch done."""
    record = _stored_run(run_id, out)
    call = ScriptCall.recalled(record.dir)
    if call is None:
        raise ConfigError(f"run {run_id} is not a script run: resume it with "
                          f"`polyrhythm train --resume {run_id}`")
    call.check(run_id)
    config, point, done = _reopened(record, out, overrides, SCRIPT_RESUMABLE, say)
    say(f"resuming run {run_id} after epoch {done}")
    # The ranks run in the script's folder, maybe not this one: they find the store by an
    # absolute path.
    config = resolve_config(config, out=str(Path(out).resolve()))
    return launcher_of(config).script(config, record, call, resume=point)


def _stored_run(run_id: str, out: str | Path) -> RunRecord:
    record = RunRecord(Path(out), run_id)
    if not (record.dir / "config.toml").is_file():
        raise ConfigError(f"no run {run_id!r} in {str(out)!r}")
    return record


def _reopened(record: RunRecord, out: str | Path, overrides: dict, resumable: set[str],
              say) -> tuple[RunConfig, Resume, int]:
    """A failed run reopened to go on (its config with `overrides`, which only `resumable`
    settings may be; the newest usable checkpoint; its epochs done), once the processes of
    an earlier launch are gone."""
    changed = set(overrides) - resumable
    if changed:
        raise ConfigError(f"a resumed run keeps its config: {', '.join(sorted(changed))} "
                          f"cannot change (only {', '.join(sorted(resumable))} can)")
    stored = load_config(record.dir / "config.toml", out=str(out))
    launcher = launcher_of(stored)
    if not launcher.resumes:
        raise ConfigError(f"run {record.run_id} ran on {launcher.title}, which cannot resume "
                          "a run: start it again")
    config = resolve_config(stored, **overrides)
    launcher_of(config).check(config)
    check_resumable(record)
    # A killed launcher's ranks leave once they see it gone (on an emulated cluster its
    # janitor ends them): wait for them, so that none writes a checkpoint any more when the
    # newest is chosen and the new ranks start.
    runlock.wait_until_free(record.dir)
    point, done = latest(record.dir, stored.workers, stored.servers, say=say)
    if "epochs" in overrides and config.epochs < done:
        # The epochs done stay in its record: ending before them would store one count of
        # epochs with the run and another in its epochs' rows.
        raise ConfigError(f"run {record.run_id} has done {done} epochs: --epochs "
                          f"{config.epochs} would end it before them; give at least {done}")
    reopen_run(record)
    return config, point, done
