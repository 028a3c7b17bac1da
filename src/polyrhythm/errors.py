"""Errors a user can cause. The CLI prints their one-line message and exits with code 2."""


class PolyrhythmError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""

    exit_code = 2


class ConfigError(PolyrhythmError):
    """An invalid run configuration (flag, TOML file or API argument)."""


class DataError(PolyrhythmError):
    """A data set that cannot be found or read."""


class StoreError(PolyrhythmError):
    """A runs directory or run store that cannot be written or read."""


class RunFailed(PolyrhythmError):
    """A distributed run ended because one of its processes failed."""

    exit_code = 1
