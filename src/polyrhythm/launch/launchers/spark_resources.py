"""About once a second, what a Spark run's processes use, as the store's resource samples of
any run: each executor (its JVM and the Python workers under it) as a worker, rank its
executor id, and the driver (this process and its gateway JVM) as rank -1, role `driver`.
The asynchronous-training thesis read MLlib's idle CPUs off such samples."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time

import psutil

from polyrhythm.launch.launchers.spark import processes_of

SAMPLE_INTERVAL_S = 1.0
_EXECUTOR = re.compile(r"--executor-id\s+(\d+)")


class SparkSampler:
    """Samples (rank, role, t, cpu %, rss bytes, bytes sent, bytes received) of run
    `run_id`'s Spark processes while in use; `moved(rank)`: the bytes a rank has sent and
    received so far, as the run counts them; `started`: the run's perf_counter start."""

    def __init__(self, run_id: str, started: float, moved) -> None:
        self.run_id, self.started, self.moved = run_id, started, moved
        self.samples: list[tuple] = []
        self._seen: dict[int, psutil.Process] = {}  # cpu_percent needs the same object
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spark-resources")

    def __enter__(self) -> SparkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        self._groups()  # starts every process's CPU clock
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            now = time.perf_counter() - self.started
            for rank, processes in self._groups().items():
                cpu = rss = 0.0
                for process in processes:
                    with contextlib.suppress(psutil.Error):
                        cpu += process.cpu_percent(None)
                        rss += process.memory_info().rss
                sent, received = self.moved(rank)
                self.samples.append((rank, "driver" if rank < 0 else "worker", now, cpu,
                                     int(rss), sent, received))

    def _groups(self) -> dict[int, list[psutil.Process]]:
        """The run's processes by executor (-1: the driver's)."""
        own = [psutil.Process(os.getpid()), *processes_of(self.run_id)]
        processes = [self._seen.setdefault(p.pid, p) for p in own]
        executor_of: dict[int, int] = {}
        for p in processes:
            with contextlib.suppress(psutil.Error):
                found = _EXECUTOR.search(" ".join(p.cmdline()))
                if found:
                    executor_of[p.pid] = int(found.group(1))
        groups: dict[int, list[psutil.Process]] = {}
        for p in processes:
            groups.setdefault(self._executor(p, executor_of), []).append(p)
        return groups

    @staticmethod
    def _executor(process: psutil.Process, executor_of: dict[int, int]) -> int:
        """The executor a process belongs to: its own or an ancestor's id; -1 if none."""
        with contextlib.suppress(psutil.Error):
            for p in (process, *process.parents()):
                if p.pid in executor_of:
                    return executor_of[p.pid]
        return -1
