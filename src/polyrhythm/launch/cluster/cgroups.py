"""CPU shares of emulated hosts: one cgroup per host with a CPU quota (cgroup v1's cpu
controller, `/sys/fs/cgroup/cpu`, or cgroup v2's cpu.max where v2 is what the machine has),
and one group per run inside it for the run's processes, so that a run's processes can be
listed, measured and killed whoever started them.

All of ours live under `polyrhythm/` in the controller's hierarchy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from polyrhythm.errors import ClusterError

ROOT_NAME = "polyrhythm"
PERIOD_US = 100_000
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def hierarchy() -> tuple[Path, int]:
    """Where our groups go and the cgroup version: v1's cpu controller if mounted, else v2
    with cpu among its controllers (a hybrid machine's v2 at /sys/fs/cgroup/unified has no
    controllers: it is v1 that limits CPU there)."""
    if (V1 / "cpu.cfs_quota_us").exists():
        return V1 / ROOT_NAME, 1
    if "cpu" in _read(V2 / "cgroup.controllers").split():
        return V2 / ROOT_NAME, 2
    raise ClusterError("no cgroup CPU controller (neither /sys/fs/cgroup/cpu nor cgroup v2 "
                       "with cpu): cannot give hosts CPU shares")


def quota_files(version: int, cores: float) -> dict[str, str]:
    """What to write, file by file and in order, to give a group `cores` CPUs: v1 takes a
    period, then a quota (which the kernel reads against the period in place), v2 both in
    cpu.max. Either way at least 1 ms a period, the kernel's least quota."""
    quota = max(1000, int(cores * PERIOD_US))
    if version == 1:
        return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {PERIOD_US}"}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterError(f"cannot make cgroup {path}: {exc.strerror}") from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise ClusterError(f"cannot write {path}: {exc.strerror}") from None


def _enable_cpu(group: Path) -> None:
    """Give a v2 group's children the cpu controller. v2 lets a group other than the root
    do so only while it holds no process of its own: a container's root group holds its
    processes, so there this fails (busy) until they move to a group below."""
    try:
        (group / "cgroup.subtree_control").write_text("+cpu")
    except OSError as exc:
        why = ("it holds processes of its own (cgroup v2 passes controllers on only from "
               "groups without; in a container, move its processes to a child group first)"
               if exc.errno == errno.EBUSY else exc.strerror)
        raise ClusterError(f"cannot enable the cpu controller below cgroup {group}: "
                           f"{why}") from None


class CpuGroup:
    """One cgroup of ours: made on `create`, removed (its processes killed) on `remove`."""

    def __init__(self, *parts: str) -> None:
        root, self.version = hierarchy()
        self.path = root.joinpath(*parts)

    def create(self, cores: float | None = None) -> CpuGroup:
        """Make the group (and its parents), with a quota of `cores` if given."""
        if self.version == 2:  # v2: a group's children get the cpu controller only if asked
            for parent in reversed([self.path.parent, *self.path.parent.parents]):
                if parent == V2 or parent.is_relative_to(V2 / ROOT_NAME):
                    _mkdir(parent)
                    _enable_cpu(parent)
        _mkdir(self.path)
        if cores is not None:
            for name, text in quota_files(self.version, cores).items():
                _write(self.path / name, text)
        return self

    def exists(self) -> bool:
        return self.path.is_dir()

    def pids(self) -> list[int]:
        """Processes in the group and its children."""
        return [int(p) for f in self.path.rglob("cgroup.procs") for p in _read(f).split()]

    def threads(self) -> list[int]:
        """Threads in the group and its children (what the scheduler sees)."""
        name = "tasks" if self.version == 1 else "cgroup.threads"
        return [int(t) for f in self.path.rglob(name) for t in _read(f).split()]

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the group until none is left."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill its processes, then remove it and its children (deepest first)."""
        if not self.exists():
            return
        self.kill()
        for group in sorted((p for p in self.path.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True) + [self.path]:
            _remove(group)


def _remove(group: Path) -> None:
    for attempt in range(50):  # a killed process leaves its group a moment after it dies
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno == 2:
                return
            if attempt == 49:
                raise ClusterError(f"cannot remove cgroup {group}: {exc.strerror}") from None
            time.sleep(0.05)


def ours() -> list[str]:
    """Every cgroup of ours on this machine (none once all is torn down)."""
    try:
        root, _ = hierarchy()
    except ClusterError:
        return []
    if not root.exists():
        return []
    return [str(root)] + sorted(str(p) for p in root.rglob("*") if p.is_dir())


def remove_root_if_empty() -> None:
    """Remove `polyrhythm/` itself once no cluster of ours has a group in it."""
    with contextlib.suppress(ClusterError, OSError):
        root, _ = hierarchy()
        if root.exists() and not any(p.is_dir() for p in root.iterdir()):
            root.rmdir()
