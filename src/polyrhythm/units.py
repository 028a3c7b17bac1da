"""Durations ("120ms") and link rates ("100mbit") as config values are written, and the
random delays built from them. Torch-free: the config, the transport and the simulator read
them alike.

Rates use tc's units (bit, kbit, mbit, gbit, tbit; decimal, in bits per second), not its
byte units (tc reads "mbps" as megabytes per second, a classic mix-up, so it is refused).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from polyrhythm.errors import ConfigError

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
DISTRIBUTIONS = ("normal", "uniform", "exponential")


def duration(text: str, name: str = "duration") -> float:
    """Seconds in a duration such as "120ms", "1.5s" or "250us"."""
    match = re.fullmatch(_NUMBER + r"\s*(us|ms|s)", str(text).strip())
    seconds = float(match[1]) * _DURATION_UNITS[match[2]] if match else math.nan
    if not math.isfinite(seconds):  # 400 digits read as inf
        raise ConfigError(f"{name} must be a duration such as 120ms, 1.5s or 250us, "
                          f"got {text!r}")
    return seconds


def rate(text: str, name: str = "rate") -> float:
    """Bits per second in a rate such as "100mbit" or "1gbit"."""
    match = re.fullmatch(_NUMBER + r"\s*([kmgt]?bit)", str(text).strip().lower())
    bits = float(match[1]) * _RATE_UNITS[match[2]] if match else 0.0
    if not 0 < bits < math.inf:  # 400 digits read as inf
        raise ConfigError(f"{name} must be a positive rate such as 100mbit or 1gbit (bits "
                          f"per second), got {text!r}")
    return bits


def is_duration(text: str) -> bool:
    return _reads(duration, text)


def is_rate(text: str) -> bool:
    return _reads(rate, text)


def _reads(parse, text: str) -> bool:
    try:
        parse(text)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class Delay:
    """A random delay in seconds: `mean`, spread by `jitter` as `distribution` says.

    - normal: standard deviation `jitter`, cut at zero;
    - uniform: anywhere in mean ± jitter, cut at zero;
    - exponential: mean + an exponential tail of mean `jitter` (a straggler's long tail).

    Each user draws from its own seeded generator (`sampler`), so a run's delays repeat."""

    mean: float
    jitter: float = 0.0
    distribution: str = "normal"

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got "
                              f"{self.distribution!r}")

    def sampler(self, seed: int):
        """A function drawing successive delays, reproducible from `seed`."""
        rng = random.Random(seed)
        mean, jitter = self.mean, self.jitter
        if jitter == 0:
            return lambda: mean
        if self.distribution == "normal":
            return lambda: max(0.0, rng.gauss(mean, jitter))
        if self.distribution == "uniform":
            return lambda: max(0.0, rng.uniform(mean - jitter, mean + jitter))
        return lambda: mean + rng.expovariate(1.0 / jitter)
