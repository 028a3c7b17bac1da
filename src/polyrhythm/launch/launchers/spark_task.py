"""What each Spark barrier task of a `--launcher spark` run does on its executor
(launch/launchers/spark_ranks.py runs them): it starts its rank, `python -m polyrhythm.node`, as a
child process with torchrun's variables, waits for it, and returns its exit code.

Rank 0's task picks a free port on its host; every task learns rank 0's host (loopback,
where every task runs on one host) and that port from Spark's barrier (allGather), which is
the rendezvous torchrun's --master-addr and --master-port would be; rank 0 listens there
behind its gate for the ranks that prove the run's secret (launch/rank/gate.py), which the
driver made and gives every task in its environment. The child dies with its task's
Python worker (PR_SET_PDEATHSIG: Spark ends a cancelled task's worker by SIGKILL, which no
Python code sees), and a task interrupted any other way kills its child first.

Torch-free: an executor's Python worker imports this module to run the task (the rank's own
process imports torch), so that it stays small and starts at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.accumulators import AccumulatorParam

from polyrhythm.launch.process.prctl import signal_on_parent_death

# What a rank on loopback gets unless the user set it (launch/process/forkserver.py's reasons): Gloo
# listening on loopback only, OpenMP's idle threads spinning briefly.
LOOPBACK_ENVIRONMENT = {"GLOO_SOCKET_IFNAME": "lo"}
LOOPBACK = "127.0.0.1"
RANK_ENVIRONMENT = {"GOMP_SPINCOUNT": "10000", "PYTHONUNBUFFERED": "1"}


class EndedRanks(AccumulatorParam):
    """An accumulator of (rank, exit code) pairs: the driver reads a task's as soon as the
    task ends, while the others still run (a collect answers only once all have)."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:  # noqa: N802 (pyspark's name)
        return value1 + value2


@dataclass(frozen=True)
class RankTask:
    """A barrier task's work, sent to the executors: run the rank whose number is the task's
    partition. `config`: the run's config with absolute paths (executors run in Spark's own
    folders); `logs`: the run's logs folder (rank N writes rankN.log there); `cwd`: the
    folder the ranks run in, where the executor's host has it (the driver's: a user's
    `--model module:function` imports from there, as a local run's do); `environment`: what
    the ranks get beside the executor's own (the run's variable, that the launcher finds every
    process of the run by; the run's secret); `ended`: an EndedRanks accumulator each task
    adds its rank's end to."""

    config: str
    run_id: str
    logs: str
    cwd: str
    environment: dict[str, str] = field(default_factory=dict)
    ended: Any = None

    def __call__(self, partition: Iterator[int]) -> Iterator[tuple[int, int]]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        rank = context.partitionId()
        ports = context.allGather(str(free_port() if rank == 0 else 0))
        host = rendezvous_host([host_of(task.address) for task in context.getTaskInfos()])
        code = self.run(rank, len(ports), host, int(ports[0]))
        if self.ended is not None:
            self.ended.add([(rank, code)])
        yield rank, code

    def run(self, rank: int, world: int, master: str, port: int) -> int:
        """Run rank `rank` of `world` to its end, rank 0 at `master`:`port`; its exit code
        (negative: the signal that killed it)."""
        environment = {**RANK_ENVIRONMENT, **(LOOPBACK_ENVIRONMENT if is_loopback(master)
                                              else {}),
                       **os.environ, **self.environment,
                       "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
                       "GROUP_WORLD_SIZE": str(world), "MASTER_ADDR": master,
                       "MASTER_PORT": str(port)}
        logs = Path(self.logs)
        logs.mkdir(parents=True, exist_ok=True)  # a host without the run's disk: its own
        cwd = self.cwd if Path(self.cwd).is_dir() else None
        parent = os.getpid()
        with open(logs / f"rank{rank}.log", "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "polyrhythm.node", self.config, "--run-id", self.run_id],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=environment, cwd=cwd, preexec_fn=lambda: die_with(parent))
        try:
            return child.wait()
        finally:  # the task interrupted (an exception in the wait): its rank goes with it
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                child.wait()


def die_with(parent: int) -> None:
    """In the child, before exec: SIGKILL when the process that started it ends, even by
    SIGKILL; at once if it already has (it may end between the fork and this call)."""
    signal_on_parent_death(signal.SIGKILL)  # not Linux: the wait's finally only
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def free_port() -> int:
    """A TCP port free on every interface of this host now, for rank 0's gate (the instant
    between this and the rank binding it is torchrun's --standalone race too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def host_of(address: str) -> str:
    """The host of an executor's address as Spark gives it: HOST:PORT, [IPV6]:PORT."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]" in address else address
    return host.strip("[]")


def rendezvous_host(hosts: list[str]) -> str:
    """Where the ranks meet rank 0, from every task's host (rank 0's first): its host, or
    loopback where every task runs on that one host (local-cluster: the job then listens
    on this machine's loopback only)."""
    return LOOPBACK if len(set(hosts)) == 1 else hosts[0]


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback: every rank then runs here (none could reach
    it from elsewhere), and Gloo may listen on loopback alone."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False
