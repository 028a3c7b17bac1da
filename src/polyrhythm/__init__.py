"""polyrhythm: distributed data-parallel training with every consistency strategy.

`polyrhythm.init()` joins a user's script to its job (launch/rank/script_rank.py);
`polyrhythm.train` loads the launcher and runtime (and torch), and `polyrhythm.RunConfig` the
declarations, when first used: importing the package, or a part of it such as the run store,
stays light.
"""

from typing import Any

from polyrhythm.errors import (
    ConfigError,
    DataError,
    Diverged,
    PolyrhythmError,
    RunFailed,
    StoreError,
)

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataError", "Diverged", "PolyrhythmError", "RunConfig", "RunFailed",
           "StoreError", "init", "resume", "train"]


def __getattr__(name: str) -> Any:
    if name == "init":  # a user's script joining its job
        from polyrhythm.launch.rank.script_rank import init

        return init
    if name in ("train", "resume"):
        from polyrhythm import api

        return getattr(api, name)
    if name == "RunConfig":
        from polyrhythm.config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'polyrhythm' has no attribute {name!r}")
