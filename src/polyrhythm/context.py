"""Who is who in a job, passed explicitly to every role (no roles read from the environment)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polyrhythm.comm.transport import Transport
from polyrhythm.metrics.recorder import Spans


@dataclass(frozen=True)
class Topology:
    """Global rank -> role: servers first (0 .. S-1), then workers (S .. S+N-1)."""

    servers: int
    workers: int

    @property
    def world_size(self) -> int:
        return self.servers + self.workers

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.servers))

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.servers, self.world_size))

    def role(self, rank: int) -> str:
        return "server" if rank < self.servers else "worker"

    def worker_index(self, rank: int) -> int:
        return rank - self.servers

    def describe(self, rank: int) -> str:
        """'server 0' or 'worker 2', for messages a user reads."""
        if rank < self.servers:
            return f"server {rank}"
        return f"worker {self.worker_index(rank)}"


ProgressSink = Callable[[dict[str, Any]], None]


def no_progress(event: dict[str, Any]) -> None:
    """A progress sink that drops every event."""


@dataclass
class RankContext:
    """What one process of a job knows: the run, its place in the job, and its instruments."""

    config: Any  # RunConfig (kept loose to avoid an import cycle)
    rank: int
    topology: Topology
    transport: Transport = field(default_factory=Transport)
    spans: Spans = field(default_factory=Spans)
    progress: ProgressSink = no_progress
    started: float = field(default_factory=time.perf_counter)  # reset when the job starts
    clock_began: float = field(default_factory=time.time)  # ... and when that was (wall clock)
    run_dir: Any = None  # the run record's folder (Path): checkpoints go there; None: none
    resume: Any = None  # a checkpoint to start from (runtime/checkpoint.py Resume)
    # In a user's script: its own optimizer, as the optim.Updater the workers step where
    # they step one themselves (runtime/worker/script.py); None: the run's [optimizer].
    user_optimizer: Any = None
    # The words of a script's optimizer's settings in each push's header, between the
    # header's fields and the values (optim.OptimizerSpec.push_words; 0: none ride).
    push_hyper_words: int = 0

    @property
    def worker_index(self) -> int:
        return self.topology.worker_index(self.rank)

    def now(self) -> float:
        """Seconds since the job started (every rank starts its clock after one barrier)."""
        return time.perf_counter() - self.started

    def start_clock(self, resumed_s: float = 0.0) -> None:
        """Start the job's clock, every rank at once (after one barrier): a resumed run's
        goes on from the first worker's `resumed_s` (its checkpoint's time), so that the
        run's records keep one time line whoever wrote them. Every rank of a job calls it
        once, when it is ready to train or serve."""
        if self.resume is not None:
            resumed_s = self.transport.broadcast_object(resumed_s,
                                                        src=self.topology.worker_ranks[0])
        self.transport.barrier()
        self.started, self.clock_began = time.perf_counter() - resumed_s, time.time()
