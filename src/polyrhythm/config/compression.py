"""The [compression] section across the run: which messages a compressor may compress for a
strategy, and a stored config without it while nothing is compressed."""

from __future__ import annotations

from typing import Any

from polyrhythm.compression import COMPRESSORS, SHARED
from polyrhythm.config.servers import goes_on_elastic
from polyrhythm.errors import ConfigError
from polyrhythm.settings import Settings
from polyrhythm.strategies import STRATEGIES

DEFAULTS = {p.name: p.default for p in SHARED}


def check_compression(compression: Settings, strategy: Settings, run: Settings) -> None:
    """One line if the run's compression cannot be: settings of compression without a
    compressor, a compressor for a strategy whose messages are not compressible, replies
    compressed where no server replies, or where a value bound must
    know what each worker holds."""
    name = compression.name
    if not COMPRESSORS[name].compresses:
        for key in ("error_feedback", "compress_replies"):
            if compression[key]:
                raise ConfigError(f"{key} needs a compressor (--compress NAME; see "
                                  "`polyrhythm compressors`)")
        return
    spec = STRATEGIES[strategy.name]
    if not spec.compressible:
        raise ConfigError(f"strategy {spec.name!r} sends its models uncompressed; drop "
                          f"--compress {name}")
    if goes_on_elastic(run, spec):  # its codecs keep state per member, and gather
        raise ConfigError(f"on_worker_failure = continue under {spec.name} sums gradients "
                          f"uncompressed: drop --compress {name}, or use abort")
    if not compression.compress_replies:
        return
    if not run.servers:
        raise ConfigError(f"compress_replies compresses parameter servers' replies, and "
                          f"{strategy.name} has no servers")
    if strategy.get("value_bound") is not None:
        raise ConfigError("compress_replies cannot go with value_bound: a worker's copy "
                          "then lags the server's by what the replies left out, which the "
                          "bound does not see")


def uncompressed_left_out(config: dict[str, Any]) -> dict[str, Any]:
    """A config in sections without the compression settings at their defaults, and without
    [compression] if nothing is compressed: a run without compression reads as it did
    before compressors existed."""
    out = dict(config)
    section = {k: v for k, v in out.pop("compression", {}).items()
               if k not in DEFAULTS or v != DEFAULTS[k]}
    if section.get("name", "none") == "none" and len(section) <= 1:
        return out
    return out | {"compression": section}
