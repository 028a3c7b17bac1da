"""Live progress on a terminal: one line per worker, redrawn in place; silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_INTERVAL_S = 0.2


class ProgressBoard:
    """Shows the latest event of each worker: epoch, step, loss and samples/s."""

    def __init__(self, workers: int, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.lines = ["waiting for data"] * workers
        self.drawn = 0
        self.last_draw = 0.0

    def update(self, event: dict) -> None:
        self.lines[event["worker"]] = (
            f"epoch {event['epoch']}/{event['epochs']}  "
            f"step {event['step']:>4}/{event['steps']}  "
            f"loss {event['loss']:.4f}  {event['samples_per_s']:8.1f} samples/s")

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last_draw < REDRAW_INTERVAL_S):
            return
        self.last_draw = now
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        body = "".join(f"\x1b[2K  worker {i}  {line}\n" for i, line in enumerate(self.lines))
        self.stream.write(up + body)
        self.stream.flush()
        self.drawn = len(self.lines)
