"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`):
just enough to open a page and read what it drew and logged, for the report's browser test.
Standard library only; every wait is bounded. Debian's `chromium` (`make test` installs it
when it can: scripts/install-chromium)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Headless, as root, on a closed network: without the background-networking flags Chromium
# keeps dialling out and logs every refused connection.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")
# What the page holds once it has loaded and decoded its images: every figure element with
# its intrinsic size (an <img>'s decoded pixels, a <canvas>'s bitmap; none for <svg>) and its
# laid-out box, and every table with its body rows and box.
INSPECT = """(async () => {
  await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
  const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const natural = e => e.tagName === 'IMG' ? [e.naturalWidth, e.naturalHeight]
    : e.tagName === 'CANVAS' ? [e.width, e.height] : null;
  return {
    figures: [...document.querySelectorAll('img, svg, canvas')].map(e => ({
      tag: e.tagName.toLowerCase(), figure: e.closest('figure')?.id ?? null,
      natural: natural(e), box: box(e)})),
    tables: [...document.querySelectorAll('table')].map(t => ({
      id: t.id, rows: t.tBodies.length ? t.tBodies[0].rows.length : 0, box: box(t)})),
  };
})()"""


def chromium_path() -> str | None:
    """Debian's chromium on PATH, or None."""
    return shutil.which("chromium")


def why_no_chromium() -> str:
    """Why chromium is missing, for a skip message: what `make test` could not do."""
    if os.geteuid() != 0:
        return ("Debian's chromium is not installed, and make test installs it only as root "
                "(apt-get install chromium)")
    if shutil.which("apt-get") is None:
        return ("Debian's chromium is not installed, and this machine has no apt-get "
                "for make test to install it with")
    return ("Debian's chromium is not installed: make test's apt-get install failed or did "
            "not run (scripts/install-chromium prints why)")


class BrowserError(RuntimeError):
    """Chromium died, answered an error, or did not answer in time."""


@dataclass
class Page:
    """What a page drew and logged."""

    figures: list[dict]
    tables: list[dict]
    errors: list[str]


class Chromium:
    """One headless Chromium with a fresh profile; `with Chromium() as browser:` ends it."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        path = chromium_path()
        if path is None:
            raise BrowserError(why_no_chromium())
        self.timeout_s = timeout_s
        self._dir = tempfile.TemporaryDirectory(prefix="polyrhythm-chromium-")
        self._log = Path(self._dir.name) / "stderr.log"
        to_browser, self._to_browser = map(_high, os.pipe())
        self._from_browser, from_browser = map(_high, os.pipe())
        with open(self._log, "wb") as log:
            # The protocol's pipe is the browser's fds 3 (commands in) and 4 (answers out).
            self.pid = os.posix_spawn(
                path, [path, *FLAGS, f"--user-data-dir={self._dir.name}/profile", "about:blank"],
                os.environ, setsid=True, file_actions=[
                    (os.POSIX_SPAWN_DUP2, to_browser, 3), (os.POSIX_SPAWN_DUP2, from_browser, 4),
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log.fileno(), 2)])
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._receive(deadline, method)
            if answer.get("id") != self._next_id:
                self._events.append(answer)
            elif "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            else:
                return answer["result"]

    def render(self, url: str) -> Page:
        """Open url in a new tab, wait for its load event, and read what it drew and logged."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self._events.clear()
        self.call("Page.navigate", {"url": url}, session=session)
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" and e.get("sessionId") == session
                      for e in self._events):
            self._events.append(self._receive(deadline, "the page's load event"))
        found = self.call("Runtime.evaluate", {"expression": INSPECT, "awaitPromise": True,
                                               "returnByValue": True}, session=session)
        if "exceptionDetails" in found:
            raise BrowserError(f"inspecting the page failed: {found['exceptionDetails']}")
        errors = [_error(e) for e in self._events if e.get("sessionId") == session]
        self.call("Target.closeTarget", {"targetId": target})
        value = found["result"]["value"]
        return Page(value["figures"], value["tables"], [e for e in errors if e])

    def close(self) -> None:
        """Ask the browser to close, wait a bounded while, then end its whole process group."""
        with contextlib.suppress(OSError):  # already gone
            os.write(self._to_browser, b'{"id": 0, "method": "Browser.close"}\0')
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):  # its renderers, and itself if it hung
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reaped above
            os.waitpid(self.pid, 0)
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._dir.cleanup()

    def _receive(self, deadline: float, waiting_for: str) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(f"no answer from chromium within {self.timeout_s:g} s "
                                   f"({waiting_for})")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"chromium exited: {self._stderr_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _stderr_tail(self) -> str:
        return self._log.read_text(errors="replace")[-2000:]


def _high(fd: int) -> int:
    """fd moved to 10 or above, so placing the pipe at the browser's fds 3 and 4 cannot
    overwrite one end with the other."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def _error(event: dict) -> str | None:
    """An error the page logged: console.error/assert, an uncaught exception, or a log entry
    at error level (a resource that failed to load, a blocked request); None otherwise."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        return "console: " + " ".join(str(a.get("value", a.get("description")))
                                      for a in params.get("args", []))
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return "exception: " + str(details.get("exception", {}).get("description")
                                   or details.get("text"))
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"log: {entry.get('text')} {entry.get('url', '')}".strip()
    return None
