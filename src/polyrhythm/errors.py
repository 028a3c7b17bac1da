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
    """A distributed run ended early: one of its processes failed, or it was interrupted.

    `run_id` names its record (stored as failed); `interrupted` is True when Ctrl-C or
    SIGTERM stopped it rather than a failure."""

    exit_code = 1

    def __init__(self, message: str, run_id: str | None = None,
                 interrupted: bool = False, diverged: bool = False) -> None:
        super().__init__(message)
        self.run_id, self.interrupted, self.diverged = run_id, interrupted, diverged


class Diverged(PolyrhythmError):
    """Training produced a non-finite loss or parameter: the run stops as `diverged`."""

    exit_code = 1


class ClusterError(PolyrhythmError):
    """An emulated cluster that cannot be made or used here: not root, no `ip` or `tc`, no
    cgroup CPU controller, or a command that failed."""


def one_line(exc: BaseException) -> str:
    """An error's first line ('' if it has no words)."""
    return str(exc).splitlines()[0] if str(exc) else ""
