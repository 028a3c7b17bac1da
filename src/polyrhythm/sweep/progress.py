"""What a sweep shows while it runs: a line per finished run, and a live bar on a terminal."""

from __future__ import annotations

import shutil
import threading
import time
from typing import TextIO


class SweepProgress:
    """One line per finished run on the stream; on a terminal also a live bar meanwhile."""

    BAR = 20

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.live = stream.isatty()
        self._ticker: threading.Thread | None = None
        self._stopped = threading.Event()

    def note(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, index: int, label: str) -> None:
        if not self.live:
            return
        self._stopped.clear()
        began = time.monotonic()
        filled = self.BAR * (index - 1) // self.total
        bar = "#" * filled + "." * (self.BAR - filled)
        width = shutil.get_terminal_size().columns - 1  # a wrapped line would not redraw

        def tick() -> None:
            while True:
                line = f"[{index}/{self.total}] [{bar}] {time.monotonic() - began:4.0f} s  {label}"
                self.stream.write(f"\r\x1b[2K{line[:width]}")
                self.stream.flush()
                if self._stopped.wait(0.5):
                    return

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def finish(self, index: int, label: str, text: str) -> None:
        if self._ticker is not None:
            self._stopped.set()
            self._ticker.join()
            self._ticker = None
            self.stream.write("\r\x1b[2K")
        self.note(f"[{index}/{self.total}] {label}: {text}")
