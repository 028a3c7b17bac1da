"""RunConfig: one validated description of a training run, from flags, TOML or Python."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from polyrhythm.errors import ConfigError


def default_workers() -> int:
    """CPU cores, capped at 4: more workers than cores only slows real compute down."""
    return max(1, min(os.cpu_count() or 1, 4))


class RunConfig(BaseModel):
    """Everything that defines a run. Unknown keys are errors; `servers` is resolved on creation."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    strategy: str = Field("bsp", description="consistency strategy (see `polyrhythm strategies`)")
    workers: int = Field(default_factory=default_workers, description="number of workers N")
    servers: int | None = Field(
        None, description="parameter-server shards (default 1 for PS strategies, 0 otherwise)"
    )
    staleness: int = Field(3, description="ssp: how many clocks a worker may run ahead")
    value_bound: float | None = Field(
        None, description="ssp: hold pushes while the applied change some worker has not "
        "pulled yet exceeds this in max-norm (default: no value bound)")
    quorum: int | None = Field(
        None, description="kbsp, kasp, softsync: gradients per update (default: N-1 for kbsp, "
        "N/2 for kasp, 1 for softsync)")
    backup: int = Field(
        1, description="backup: spare workers b; the first N-b gradients of a round count")
    lr_floor: float = Field(
        0.1, description="softsync: smallest share of lr a stale gradient keeps")
    push_every: int = Field(1, description="downpour: push accumulated gradients every n steps")
    fetch_every: int = Field(1, description="downpour: fetch parameters every n steps")
    tau: int = Field(4, description="localsgd, easgd: local steps between synchronisations")
    alpha: float | None = Field(
        None, description="easgd: elastic moving rate (default: 0.9/N)")
    gossip_p: float = Field(
        0.2, description="gossip: probability of sending the model to a random peer per step")
    bucket_kb: int | None = Field(
        None, description="PS: gradients travel in buckets of about this many KiB (default "
        "25600, 25 MiB; one bucket for strategies that decide on whole gradients)")
    epochs: int = Field(3, description="passes over the training set")
    batch_size: int = Field(64, description="global batch B; each worker takes B/N")
    lr: float = Field(0.05, description="learning rate")
    momentum: float = Field(0.9, description="SGD momentum")
    async_momentum_correction: bool = Field(
        True, description="asynchronous servers subtract the momentum asynchrony implies")
    weight_decay: float = Field(1e-4, description="L2 weight decay")
    lr_decay_every: int = Field(
        0, description="multiply lr by lr_decay every this many epochs (0: never)")
    lr_decay: float = Field(0.1, description="step learning-rate decay factor")
    dataset: str = Field("mnist5k", description="data set (see README)")
    data_path: str | None = Field(None, description="file or directory for cifar10/cifar100")
    synthetic_shape: list[int] = Field([1, 8, 8], description="synthetic: sample shape (C H W)")
    synthetic_classes: int = Field(10, description="synthetic: number of classes")
    synthetic_size: int = Field(2000, description="synthetic: number of samples")
    val_fraction: float = Field(0.1, description="share of the data held out for validation")
    model: str = Field("cnn", description="model (cnn, mlp)")
    seed: int = Field(0, description="fixes init, sharding and data order")
    steps_per_epoch: int | None = Field(None, description="cap on steps per epoch (default: all)")
    worker_delay_s: list[float] = Field(
        [], description="extra seconds of emulated compute per step, one entry per worker"
    )
    threads: int | None = Field(None, description="torch threads per worker (default: cores/N)")
    warmup_steps: int = Field(
        5, description="first steps of each worker left out of throughput figures")
    instrumentation: bool = Field(
        True, description="record every iteration's spans, server events and ~1 Hz resource "
        "samples in the store (off: totals only)")
    out: str = Field("runs", description="directory that holds run records and the store")

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        from polyrhythm.data.datasets import DATASETS, PATH_DATASETS
        from polyrhythm.models import MODELS
        from polyrhythm.strategies import STRATEGIES

        _one_of("strategy", self.strategy, STRATEGIES)
        _one_of("model", self.model, MODELS)
        _one_of("dataset", self.dataset, DATASETS)
        if self.data_path is not None and self.dataset not in PATH_DATASETS:
            raise ValueError(f"dataset {self.dataset!r} takes no data path; "
                             f"only {', '.join(sorted(PATH_DATASETS))} do")
        spec = STRATEGIES[self.strategy]
        settings = {field: getattr(self, field) for field in self.model_fields_set}
        unread = unread_fields(settings)
        for field in sorted(unread & STRATEGY_PARAMETERS):
            takes = ", ".join("--" + p.replace("_", "-") for p in spec.parameters) or "none"
            raise ValueError(f"strategy {self.strategy!r} takes no --{field.replace('_', '-')}"
                             f" (its parameters: {takes})")
        whole = spec.uses_servers and spec.whole_gradient(settings)
        if "bucket_kb" in unread:
            why = "it pushes whole gradients" if whole else "it uses no servers"
            raise ValueError(f"strategy {self.strategy!r} takes no --bucket-kb ({why})")
        if spec.uses_servers and not whole and self.bucket_kb is None:
            object.__setattr__(self, "bucket_kb", DEFAULT_BUCKET_KB)
        if whole and (self.servers or 1) != 1:
            raise ValueError(f"strategy {self.strategy!r} decides on whole gradients, so it "
                             f"runs with 1 server, got {self.servers}")
        if self.servers is None:
            object.__setattr__(self, "servers", 1 if spec.uses_servers else 0)
        for field, default in spec.defaults(self).items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, default)
        _check_ranges(self, spec.uses_servers)
        return self

    @property
    def world_size(self) -> int:
        """Processes in the job: servers first, then workers."""
        return self.servers + self.workers

    def to_dict(self) -> dict[str, Any]:
        """The resolved fields, without other strategies' parameters: loads back as is."""
        from polyrhythm.strategies import STRATEGIES

        foreign = STRATEGY_PARAMETERS - set(STRATEGIES[self.strategy].parameters)
        return self.model_dump(exclude_none=True, exclude=foreign)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


DEFAULT_BUCKET_KB = 25600  # 25 MiB, as DDP's default bucket: one bucket for small models

# Fields that only some strategies read: setting one for another strategy is an error.
STRATEGY_PARAMETERS = {"staleness", "value_bound", "quorum", "backup", "lr_floor",
                       "push_every", "fetch_every", "tau", "alpha", "gossip_p"}


def unread_fields(settings: Mapping[str, Any]) -> set[str]:
    """Those of a run's `settings` (field -> value; fields left unset are absent) that its
    strategy does not read: other strategies' parameters; servers and bucket_kb for a strategy
    without servers; bucket_kb where the policy decides on whole gradients. RunConfig rejects
    them (servers = 0 aside); a sweep drops them from a point. An unknown strategy reads all."""
    from polyrhythm.strategies import STRATEGIES

    spec = STRATEGIES.get(settings.get("strategy", RunConfig.model_fields["strategy"].default))
    if spec is None:
        return set()  # validation names the unknown strategy
    unread = STRATEGY_PARAMETERS - set(spec.parameters)
    if not spec.uses_servers:
        unread |= {"servers", "bucket_kb"}
    elif spec.whole_gradient(settings):
        unread.add("bucket_kb")
    return unread & set(settings)


def _one_of(field: str, value: str, valid: dict) -> None:
    if value not in valid:
        raise ValueError(f"unknown {field} {value!r}; valid: {', '.join(sorted(valid))}")


def _check_ranges(c: RunConfig, uses_servers: bool) -> None:
    rules = [
        (c.workers >= 1, f"workers must be at least 1, got {c.workers}"),
        (c.servers >= 0, f"servers must be at least 0, got {c.servers}"),
        (not uses_servers or c.servers >= 1,
         f"strategy {c.strategy!r} needs at least 1 server, got {c.servers}"),
        (uses_servers or c.servers == 0,
         f"strategy {c.strategy!r} uses no servers; drop --servers"),
        (c.staleness >= 0, f"staleness must be at least 0, got {c.staleness}"),
        (c.value_bound is None or c.value_bound > 0,
         f"value_bound must be positive, got {c.value_bound}"),
        (c.quorum is None or 1 <= c.quorum <= c.workers,
         f"quorum must be between 1 and the worker count {c.workers}, got {c.quorum}"),
        (1 <= c.backup < c.workers or c.strategy != "backup",
         f"backup must be at least 1 and below the worker count {c.workers}, got {c.backup}"),
        (0 < c.lr_floor <= 1, f"lr_floor must be in (0, 1], got {c.lr_floor}"),
        (c.push_every >= 1, f"push_every must be at least 1, got {c.push_every}"),
        (c.fetch_every >= 1, f"fetch_every must be at least 1, got {c.fetch_every}"),
        (c.tau >= 1, f"tau must be at least 1, got {c.tau}"),
        (c.alpha is None or 0 < c.alpha <= 1, f"alpha must be in (0, 1], got {c.alpha}"),
        (0 < c.gossip_p <= 1, f"gossip_p must be in (0, 1], got {c.gossip_p}"),
        (c.bucket_kb is None or c.bucket_kb >= 1,
         f"bucket_kb must be at least 1, got {c.bucket_kb}"),
        (c.epochs >= 1, f"epochs must be at least 1, got {c.epochs}"),
        (c.batch_size >= c.workers,
         f"batch size {c.batch_size} is smaller than the worker count {c.workers}"),
        (c.lr > 0, f"lr must be positive, got {c.lr}"),
        (0 <= c.momentum < 1, f"momentum must be in [0, 1), got {c.momentum}"),
        (c.weight_decay >= 0, f"weight decay must be at least 0, got {c.weight_decay}"),
        (c.lr_decay_every >= 0, f"lr_decay_every must be at least 0, got {c.lr_decay_every}"),
        (0 < c.val_fraction < 1, f"val_fraction must be in (0, 1), got {c.val_fraction}"),
        (c.steps_per_epoch is None or c.steps_per_epoch >= 1,
         f"steps_per_epoch must be at least 1, got {c.steps_per_epoch}"),
        (all(d >= 0 for d in c.worker_delay_s), "worker_delay_s entries must be at least 0"),
        (len(c.worker_delay_s) <= c.workers,
         f"worker_delay_s has {len(c.worker_delay_s)} entries for {c.workers} workers"),
        (c.threads is None or c.threads >= 1, f"threads must be at least 1, got {c.threads}"),
        (c.warmup_steps >= 0, f"warmup_steps must be at least 0, got {c.warmup_steps}"),
        (c.synthetic_classes >= 2, "synthetic_classes must be at least 2"),
        (c.synthetic_size >= 2 * c.synthetic_classes,
         "synthetic_size must be at least twice synthetic_classes"),
        (len(c.synthetic_shape) in (1, 3) and all(s >= 1 for s in c.synthetic_shape),
         "synthetic_shape must be [features] or [channels, height, width] of positive sizes"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)


def make_config(values: dict[str, Any]) -> RunConfig:
    """Build a RunConfig, turning pydantic's multi-line report into one ConfigError line."""
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown config key {where!r}"
    return f"{where}: {msg}" if where else msg


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML config file into a dict of RunConfig fields."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")  # TOML is UTF-8 whatever the locale says
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(p)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {str(p)!r}: {exc}") from None


def load_config(path: str | os.PathLike | None = None, **overrides: Any) -> RunConfig:
    """Config from an optional TOML file, with keyword overrides taking precedence."""
    values = load_toml(path) if path is not None else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return make_config(values)
