"""Who launched a run, and whether that process is gone: a run left `running` by a launcher
that died is marked failed (`launcher gone`) the next time the store lists its runs."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

_PROC = Path("/proc")


def process_identity(pid: int | None = None) -> dict:
    """A process (this one by default) as the launcher of a run: this host's name, its PID
    namespace and boot, the pid and the process's start time (in /proc: clock ticks after
    boot, field 22 of /proc/<pid>/stat; elsewhere psutil's create time). A pid alone is not
    enough: pids are reused, and a start time tells a reused pid from its first process."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pidns": _pid_namespace(), "boot": _boot_id(),
            "pid": pid, "start": _start_time(pid)}


def launcher_gone(launcher: dict | None, here: dict) -> bool:
    """Whether a run's launcher (as process_identity recorded it) is surely gone, asked on
    the host `here` (process_identity()). False when unsure: another host (or PID namespace),
    no launcher recorded, a process this one may not inspect."""
    if not isinstance(launcher, dict) or launcher.get("host") != here["host"]:
        return False
    if launcher.get("pidns") and here["pidns"] and launcher["pidns"] != here["pidns"]:
        return False  # another container on a host of the same name: its pids are not ours
    if launcher.get("boot") and here["boot"] and launcher["boot"] != here["boot"]:
        return True  # the host has rebooted since
    pid = launcher.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    started = launcher.get("start")
    if started is not None:
        now = _start_time(pid)
        if now is not None and now != started:
            return True  # the pid now belongs to another process
    return _dead_but_unreaped(pid)


def read_identity(text: str | None) -> dict | None:
    """A launcher as stored (JSON), or None if absent or unreadable."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else None
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat from the third (the state) on; None if unreadable."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces


def _start_time(pid: int) -> str | None:
    if (_PROC / "self" / "stat").exists():
        fields = _stat(pid)
        return fields[19] if fields and len(fields) > 19 else None  # field 22: starttime
    try:
        import psutil  # not Linux: no /proc to read

        return f"{psutil.Process(pid).create_time():.3f}"
    except Exception:  # noqa: BLE001 - no psutil, no such process, access denied: unknown
        return None


def _dead_but_unreaped(pid: int) -> bool:
    """A zombie: exited, its parent has not yet waited for it (only its main thread left,
    in state Z: a leader in Z with threads still running is alive)."""
    fields = _stat(pid)
    if not fields or fields[0] != "Z":
        return False
    try:
        return len(list((_PROC / str(pid) / "task").iterdir())) <= 1
    except OSError:
        return False


def _pid_namespace() -> str | None:
    try:
        return os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return None


def _boot_id() -> str | None:
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
