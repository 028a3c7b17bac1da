"""RunConfig: one validated description of a training run, from flags, TOML or Python.

A config has general settings at the top and five sections:

    workers = 4             # the run: workers, servers, epochs, batch size, seed, ...
    epochs = 3
    [strategy]              # its name and the strategy's own parameters
    name = "ssp"
    staleness = 2
    [data]                  # its name, val_fraction and the data set's own parameters
    name = "mnist5k"
    [model]                 # its name and the model's own parameters
    name = "cnn"
    [optimizer]             # sgd (default), adam, ...; lr, momentum, weight decay, lr decay
    name = "sgd"
    lr = 0.05
    [cluster]               # an emulated cluster, and latency (config/emulation.py)
    hosts = 4

Each strategy, data set and model declares its parameters (settings.py); the general and
optimizer settings are declared in config/declared.py, the cluster and emulated compute in
config/emulation.py. A parameter's name is unique across sections, so every
setting is also a flat key (`strategy = "ssp"`, `staleness = 2`, `dataset = "mnist5k"`,
`lr = 0.05`), as the command-line flags are. A run's config.toml written by polyrhythm 0.1
(flat, every field) loads as it is. How configs are stored is metrics/records.py's.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

from polyrhythm.compression import NONE
from polyrhythm.config.composed import into_halves
from polyrhythm.config.compression import check_compression, uncompressed_left_out
from polyrhythm.config.declared import GENERAL, OPTIMIZER, check_optimizer, stored
from polyrhythm.config.emulation import (
    CLUSTER,
    check_compute,
    check_waits,
    collocated_servers,
    settle,
    unemulated_left_out,
)
from polyrhythm.config.sections import (
    COMPONENTS,
    Kind,
    flat_config,
    flat_keys,
    layered,
    merged,
    owners,
    sectioned,
)
from polyrhythm.config.servers import (
    check_min_workers,
    check_shared_epochs,
    servers_of,
    worker_failure_of,
)
from polyrhythm.errors import ConfigError
from polyrhythm.files import read_regular
from polyrhythm.metrics.records import SECTIONS
from polyrhythm.settings import Param, Settings, shown
from polyrhythm.strategies import STRATEGIES

__all__ = ["CLUSTER", "COMPONENTS", "GENERAL", "MAX_CONFIG_BYTES", "OPTIMIZER", "Kind",
           "RunConfig", "flat_config", "flat_keys", "layered", "load_config", "load_toml",
           "make_config", "merged", "given_to_a_script", "owners", "sectioned",
           "unread_by_a_script", "unread_fields"]


class RunConfig:
    """Everything that defines a run, validated on creation: `RunConfig(**values)` with flat
    keys, sections or both. The general settings read as attributes (`config.workers`); the
    sections are `Settings` (`config.strategy.name`, `config.strategy.tau`,
    `config.optimizer.lr`). Invalid values are one-line ConfigErrors."""

    def __init__(self, /, **values: Any) -> None:
        given = sectioned(values)
        given["strategy"] = into_halves(given["strategy"], STRATEGIES,
                                        COMPONENTS["strategy"].default)
        general = {p.name: p.resolve(given.get(p.name), None) for p in GENERAL}
        general |= _batch(given, general)
        run = Settings(general)
        strategy = _component("strategy", given["strategy"], run)
        cluster = _section("cluster", CLUSTER, given["cluster"], run)
        spec = STRATEGIES[strategy.name]
        general |= servers_of(spec, given, general,
                              collocated_servers(cluster, general["workers"]))
        if general["shared_epochs"]:
            check_shared_epochs(spec, strategy, general["workers"])
        general["on_worker_failure"] = worker_failure_of(spec, strategy, general)
        check_min_workers(general)
        run = Settings(general)
        sections = {"strategy": strategy,
                    "data": _component("data", given["data"], run),
                    "model": _component("model", given["model"], run),
                    "compression": _component("compression", given["compression"], run),
                    "optimizer": _section("optimizer", OPTIMIZER, given["optimizer"], run),
                    "cluster": settle(cluster, run.workers, run.servers)}
        _check_run(run)
        check_waits(run, sections["cluster"])
        check_optimizer(given["optimizer"], strategy)
        check_compression(sections["compression"], strategy, run)
        object.__setattr__(self, "_general", general)
        object.__setattr__(self, "given", given)  # what was set: resolve_config starts here
        for name, settings in sections.items():
            object.__setattr__(self, name, settings)

    def __getattr__(self, name: str) -> Any:
        general = self.__dict__.get("_general", {})
        if name in general:
            return general[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a RunConfig is read-only; build a new one")

    def __reduce__(self) -> tuple:
        return _rebuild, (self.to_dict(), self.given)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_toml())

    def __repr__(self) -> str:
        return f"RunConfig({self.to_dict()!r})"

    @property
    def world_size(self) -> int:
        """Processes in the job: servers first, then workers."""
        return self.servers + self.workers

    def to_dict(self, script: bool = False) -> dict[str, Any]:
        """The resolved config in sections, unset values left out: loads back as is. The
        emulation settings are left out too while at their defaults, so a run that emulates
        nothing reads as it did before they existed. `script`: a user's script's run, which
        never reads polyrhythm train's data, model, batch size and loss (left out), nor the
        run's epochs and [optimizer] unless they were given (left out unless given)."""
        general = {k: v for k, v in self._general.items() if stored(k, v, self.given)}
        out = general | {section: getattr(self, section).to_dict() for section in SECTIONS}
        if script:
            left = {"data", "model", *_TRAIN_JOB_ONLY}
            if "epochs" not in self.given:
                left.add("epochs")
            if not self.given["optimizer"]:
                left.add("optimizer")
            out = {k: v for k, v in out.items() if k not in left}
        return uncompressed_left_out(unemulated_left_out(out))

    def to_toml(self, script: bool = False) -> str:
        return tomli_w.dumps(self.to_dict(script))

    def columns(self) -> dict[str, Any]:
        """The store's headline columns of a run (metrics/store.py RUN_COLUMNS)."""
        return {"strategy": self.strategy.name, "workers": self.workers,
                "servers": self.servers, "epochs": self.epochs, "dataset": self.data.name,
                "model": self.model.name}


def _rebuild(resolved: dict[str, Any], given: dict[str, Any]) -> RunConfig:
    """Unpickling: the same resolved config (defaults as they were resolved, not as this
    machine would), remembering what was set."""
    config = RunConfig(**resolved)
    object.__setattr__(config, "given", given)
    return config


def _component(section: str, values: Mapping[str, Any], run: Settings,
               inside: str | None = None) -> Settings:
    """A section that names a component: its name and the parameters it reads. `inside`
    names the parameter that holds it when it is part of another component."""
    kind = COMPONENTS[section]
    label = inside or kind.name_key
    if inside is not None and "name" not in values:
        raise ConfigError(f"{inside} needs the name of a {kind.registry.kind}")
    name = values.get("name", kind.default)
    if type(name) is not str:
        raise ConfigError(f"{label} must be a valid string, got {shown(name)}")
    component = kind.registry.lookup(name)
    params = kind.params(name)
    for key in values:
        if key != "name" and key not in {p.name for p in params}:
            raise ConfigError(_not_read(section, component, key))
    settings = _section(section, params, values, run, name=name, nested=inside is not None)
    for problem in (component.check and component.check(settings, run),
                    kind.check and kind.check(settings)):
        if problem:
            raise ConfigError(problem)
    return settings


def _section(section: str, params: tuple[Param, ...], values: Mapping[str, Any],
             run: Settings, name: str | None = None, nested: bool = False) -> Settings:
    known = {p.name for p in params} | ({"name"} if name else set())
    for key in values:
        if key not in known:
            raise ConfigError(_misplaced(section, key))
    resolved = {p.name: p.resolve(values.get(p.name), run) for p in params}
    for p in params:
        if p.section is None:
            continue
        # Another component inside this one (a composed strategy's half), with its own
        # settings; one level deep, so a component cannot hold itself.
        value = resolved[p.name]
        if value is None:
            raise ConfigError(f"{name} needs --{p.name.replace('_', '-')} (a "
                              f"{COMPONENTS[p.section].registry.kind})")
        if nested:
            raise ConfigError(f"{name}, inside another {section}, cannot hold "
                              f"{p.name} in turn")
        resolved[p.name] = _component(p.section, {"name": value} if isinstance(value, str)
                                      else value, run, inside=p.name)
    return Settings({"name": name, **resolved} if name else resolved)


def _not_read(section: str, component, key: str) -> str:
    kind = COMPONENTS[section]
    readers = sorted(c.name for c, _ in kind.registry.declarations(key))
    if not readers:
        return _misplaced(section, key)
    flag = "--" + key.replace("_", "-")
    own = ", ".join(p.flag for p in kind.params(component.name)) or "none"
    return (f"{kind.registry.kind} {component.name!r} takes no {flag} (its parameters: {own}; "
            f"{flag} is for {', '.join(readers)})")


def _misplaced(section: str, key: str) -> str:
    home = owners().get(key)
    if home is None:
        return f"unknown config key {f'{section}.{key}'!r}"
    return f"{key} belongs in {f'[{home}]' if home else 'the general settings'}, not [{section}]"


_BATCH_SIZE = next(p for p in GENERAL if p.name == "batch_size")


def _batch(given: Mapping[str, Any], general: dict) -> dict:
    """batch_size from worker_batch_size, if that is set."""
    per_worker = general["worker_batch_size"]
    if per_worker is None:
        return {}
    total = per_worker * general["workers"]
    if given.get("batch_size", total) != total:
        raise ConfigError(f"batch_size = {given['batch_size']} does not match "
                          f"worker_batch_size = {per_worker} x {general['workers']} workers; "
                          "give one")
    try:
        _BATCH_SIZE.parse(total)  # a config stored with it loads back
    except ConfigError:
        raise ConfigError(f"worker_batch_size = {per_worker} x {general['workers']} workers "
                          "is a batch_size beyond 64 bits") from None
    return {"batch_size": total}


def _check_run(run: Settings) -> None:
    """Rules across the general settings."""
    check_compute(run)
    if "\x00" in run.out:  # no path holds one: the run's record could not be written
        raise ConfigError(f"out must be a directory's path, got {shown(run.out)} (a null "
                          "byte)")
    if run.batch_size < run.workers:
        raise ConfigError(f"batch size {run.batch_size} is smaller than the worker count "
                          f"{run.workers}")
    for key in ("worker_delay_s", "slowdown", "dies_after_steps"):  # none, or one per worker
        if len(run[key]) not in (0, run.workers):
            raise ConfigError(f"{key} needs one value per worker ({run.workers}), got "
                              f"{len(run[key])}")


# polyrhythm train's own job's settings, which a script's job never reads: its loader's batch
# size, its data, its model and its loss are the script's.
_TRAIN_JOB_ONLY = ("batch_size", "worker_batch_size", "loss")


def unread_by_a_script(config: RunConfig) -> list[str]:
    """The settings `config` was given that a user's script's job never reads, as flags
    (--dataset, --batch-size, ...): polyrhythm run refuses them rather than record them."""
    given = config.given
    flags = [f"--{key}" for key in _TRAIN_JOB_ONLY if key in given]
    for section in ("data", "model"):
        flags += [f"--{COMPONENTS[section].name_key if key == 'name' else key}"
                  for key in given[section]]
    return [flag.replace("_", "-") for flag in flags]


def given_to_a_script(config: RunConfig) -> frozenset[str]:
    """The settings a script's job reads only in some scripts that `config` was given: the
    run's epochs (read where the script does not loop on job.epochs(n)) and its [optimizer]
    (read where the script wraps no optimizer of its own)."""
    return frozenset({"epochs"} & set(config.given) | set(config.given["optimizer"]))


def unread_fields(fields: Mapping[str, Any]) -> set[str]:
    """Those of a run's flat `fields` that it does not read: other strategies', data sets',
    models' or compressors' parameters; servers, bucket_kb and compress_replies for a
    strategy without servers; bucket_kb where the policy decides on whole gradients; the
    compression settings where nothing is compressed. RunConfig rejects them (servers = 0
    aside); a sweep drops them from a point. A section whose component is not a known name
    reads all (the config's validation then says what is wrong with it)."""
    given = sectioned(fields)
    given["strategy"] = into_halves(given["strategy"], STRATEGIES,
                                    COMPONENTS["strategy"].default)
    unread: set[str] = set()
    for section, kind in COMPONENTS.items():
        name = given[section].get("name", kind.default)
        if isinstance(name, str) and name in kind.registry:
            params = {p.name for p in kind.params(name)}
            unread |= set(given[section]) - params - {"name"}
    name = given["strategy"].get("name", COMPONENTS["strategy"].default)
    spec = STRATEGIES.get(name) if isinstance(name, str) else None
    if spec is not None and not spec.uses_servers:
        unread |= {"servers", "bucket_kb", "placement", "shared_epochs", "compress_replies"}
    elif spec is not None and spec.whole_gradient(given["strategy"]):
        unread.add("bucket_kb")
    if given["compression"].get("name", COMPONENTS["compression"].default) == NONE:
        unread |= {"error_feedback", "compress_replies"}
    return unread & set(fields)


def make_config(values: Mapping[str, Any]) -> RunConfig:
    """Build a RunConfig from flat keys, sections or both."""
    return RunConfig(**values)


# A config or sweep file is a page of settings; one larger is no config (and tomllib would
# hold all of it, and more, in memory).
MAX_CONFIG_BYTES = 2**20


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML config file into a dict (flat keys, sections or both): a regular file of
    at most MAX_CONFIG_BYTES (a named pipe or a device is refused, not waited on)."""
    p = Path(path)
    data = read_regular(p, "config file", ConfigError, MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")  # TOML is UTF-8 whatever the locale says
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    # tomllib raises ValueError for an integer of more than 4,300 digits and runs out of
    # stack on arrays or tables nested a thousand deep
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise ConfigError(f"invalid TOML in {str(p)!r}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"invalid TOML in {str(p)!r}: nested too deeply") from None


def load_config(path: str | os.PathLike | None = None, /, **overrides: Any) -> RunConfig:
    """Config from an optional TOML file, with keyword overrides taking precedence."""
    values = load_toml(path) if path is not None else {}
    return RunConfig(**layered(values, {k: v for k, v in overrides.items() if v is not None}))
