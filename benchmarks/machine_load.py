"""How busy the machine was with other work while a benchmark ran (torch-free, shared by
the benchmarks that run as scripts from this folder)."""

from __future__ import annotations

import os
import resource
import statistics
import time

OTHER_LOAD_WARNING = 0.2  # cores busy outside this script that make a result suspect


class OtherLoad:
    """Cores kept busy by processes outside this script while a run goes on (Linux only).

    Machine-wide busy time from /proc/stat (steal included: a shared VM's host counts too) minus
    the CPU time of this process and its descendants: those it reaped, and those alive with
    the ones they reaped (a run's ranks are children of a forkserver this process started,
    which reaps them). Anything well above zero means the run shared the machine and its
    samples/s says more about the neighbours than about the code.
    """

    def __enter__(self) -> OtherLoad:
        self.cores: float | None = None
        self._start = self._sample()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        if self._start and end:
            (wall0, busy0, own0), (wall1, busy1, own1) = self._start, end
            self.cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (wall1 - wall0))

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
        own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))
        return time.monotonic(), busy, own + _descendants_cpu()


def _descendants_cpu() -> float:
    """CPU seconds of this process's live descendants and of the children they reaped."""
    parent, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        # After the name: state, ppid, ..., utime, stime, cutime, cstime (fields 14-17).
        parent[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(v) for v in fields[11:15])
    mine, total = {os.getpid()}, 0
    grew = True  # until no process is left whose parent is one of this tree
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                total += ticks[pid]
                grew = True
    return total / os.sysconf("SC_CLK_TCK")


def shared_warning(loads: list[float]) -> str | None:
    """The line to print where other work kept more than OTHER_LOAD_WARNING cores busy during
    some run (`loads`: OtherLoad's cores, one a run)."""
    if not loads or max(loads) <= OTHER_LOAD_WARNING:
        return None
    return (f"warning: other processes kept up to {max(loads):.2f} of {os.cpu_count()} cores "
            f"busy during the runs (median {statistics.median(loads):.2f}); the ratios are "
            "only as good as the machine was quiet")
