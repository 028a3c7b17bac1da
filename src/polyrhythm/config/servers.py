"""What a run's settings owe to its strategy's servers: how many, their buckets, and whether
an epoch's work is shared among the workers by the servers' count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrhythm.config.declared import DEFAULT_BUCKET_KB
from polyrhythm.errors import ConfigError
from polyrhythm.settings import Settings
from polyrhythm.strategies.spec import StrategySpec


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
    policy = spec.policy(strategy, workers)
    if policy.elastic or policy.fixed_rounds:
        why = ("its servers add elastic differences, not gradients" if policy.elastic
               else "its servers end the run after a fixed number of rounds")
        raise ConfigError(f"strategy {spec.name!r} takes no shared_epochs ({why})")
