"""polyrhythm: distributed data-parallel training with every consistency strategy."""

from polyrhythm.api import train
from polyrhythm.config import RunConfig
from polyrhythm.errors import ConfigError, DataError, PolyrhythmError, RunFailed, StoreError

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataError", "PolyrhythmError", "RunConfig", "RunFailed", "StoreError",
           "train"]
