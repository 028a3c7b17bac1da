"""What a run's settings owe to its strategy's servers: how many, their buckets, whether an
epoch's work is shared among the workers by the servers' count, and whether they carry on
when a worker dies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrhythm.config.declared import DEFAULT_BUCKET_KB
from polyrhythm.errors import ConfigError
from polyrhythm.settings import Settings
from polyrhythm.strategies.server_updates import NOT_GRADIENTS
from polyrhythm.strategies.spec import PARAMETER_SERVER, StrategySpec

CONTINUE, ABORT = "continue", "abort"


def servers_of(spec: StrategySpec, given: Mapping[str, Any], general: dict,
              collocated: int | None) -> dict:
    """servers and bucket_kb, which depend on the strategy: servers only where it has them
    (by default 1, or one per worker host on a collocated cluster: `collocated`), buckets
    only where its policy decides per bucket."""
    servers, bucket_kb = general["servers"], general["bucket_kb"]
    whole = spec.uses_servers and spec.whole_gradient(given["strategy"])
    if bucket_kb is not None and (whole or not spec.uses_servers):
        why = "it pushes whole gradients" if whole else "it uses no servers"
        raise ConfigError(f"strategy {spec.name!r} takes no --bucket-kb ({why})")
    if whole and (servers or 1) != 1:
        raise ConfigError(f"strategy {spec.name!r} decides on whole gradients, so it runs "
                          f"with 1 server, got {servers}")
    if servers is None:
        servers = 0 if not spec.uses_servers else 1 if whole else collocated or 1
    if spec.uses_servers and servers < 1:
        raise ConfigError(f"strategy {spec.name!r} needs at least 1 server, got {servers}")
    if not spec.uses_servers and servers:
        raise ConfigError(f"strategy {spec.name!r} uses no servers; drop --servers")
    if spec.uses_servers and not whole and bucket_kb is None:
        bucket_kb = DEFAULT_BUCKET_KB
    return {"servers": servers, "bucket_kb": bucket_kb}


def check_shared_epochs(spec: StrategySpec, strategy: Settings, workers: int) -> None:
    """Shared epochs end on the servers' count of applied global batches: a strategy needs
    servers that apply gradients, with no end of their own."""
    if spec.policy is None:
        raise ConfigError(f"shared_epochs needs parameter servers; strategy {spec.name!r} "
                          "has none")
    elastic = spec.server_update in NOT_GRADIENTS
    if elastic or spec.policy(strategy, workers).fixed_rounds:
        why = ("its servers add elastic differences, not gradients" if elastic
               else "its servers end the run after a fixed number of rounds")
        raise ConfigError(f"strategy {spec.name!r} takes no shared_epochs ({why})")


def worker_failure_of(spec: StrategySpec, strategy: Settings, general: dict) -> str:
    """on_worker_failure as the run will act on it: as given, or `continue` where the
    strategy's servers make the same kind of update without the lost worker (its policy's
    `survives_lost_worker`) and another worker is left, else `abort`. A parameter server
    carries on without a lost worker, and a strategy whose workers regroup goes on over those
    left (comm/membership.py), when asked to; other strategies' peers each wait for the lost
    one."""
    given, workers = general["on_worker_failure"], general["workers"]
    servers_only = spec.family == PARAMETER_SERVER
    if given == CONTINUE and not (servers_only or spec.regroups):
        raise ConfigError(f"on_worker_failure = continue needs a strategy whose servers, or "
                          f"whose workers' sums and exchanges, go on without a lost worker; "
                          f"in strategy {spec.name!r} every worker waits for the others: use "
                          "abort")
    if given is not None:
        return given
    survives = servers_only and workers > 1 and spec.policy(strategy,
                                                            workers).survives_lost_worker
    return CONTINUE if survives else ABORT


def goes_on_elastic(run, spec: StrategySpec) -> bool:
    """Whether the workers of a run (its settings, or its config) regroup over those left
    when one is lost: a strategy's whose workers regroup, told to go on (comm/membership.py)."""
    return run.on_worker_failure == CONTINUE and spec.regroups


def check_min_workers(general: dict) -> None:
    """min_workers, the fewest workers a run that goes on without lost ones keeps: no more
    than the run starts with, and only where it goes on (above 1 in a run that aborts on a
    loss it would steer nothing: one line rather than a setting dropped)."""
    least, workers = general["min_workers"], general["workers"]
    if least > workers:
        raise ConfigError(f"min_workers = {least} is more than the run's {workers} workers: "
                          "a run goes on with at most as many workers as it starts with")
    if least > 1 and general["on_worker_failure"] != CONTINUE:
        raise ConfigError(f"min_workers = {least} says how few workers a run that goes on "
                          "without a lost one keeps, but this run aborts on any loss "
                          "(on_worker_failure = abort): drop it, or give on_worker_failure "
                          "= continue")
