"""Faults on cue (config dies_after_steps): a worker whose process ends right after its k-th
step, as SIGKILL ends it (nothing flushed, nothing said), for the studies and tests of a run
that loses a worker at a step known in advance."""

from __future__ import annotations

import os
import signal


def dies_after(config, worker: int) -> int:
    """The steps after which worker `worker` dies (0: never)."""
    steps = config.dies_after_steps
    return steps[worker] if worker < len(steps) else 0


def end_on_cue(after: int, taken: int) -> None:
    """End this process now, as SIGKILL does, if this worker dies after `taken` steps."""
    if after and taken == after:
        os.kill(os.getpid(), signal.SIGKILL)
