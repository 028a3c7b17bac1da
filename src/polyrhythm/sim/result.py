"""What a simulation reports: the figures a real run's summary has, predicted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)  # slots: the simulator updates a log a few times a step
class WorkerLog:
    """One simulated worker's account: steps, and as a run's summary measures them (after
    the warm-up steps: from the start of the first step after them) its samples, steps,
    start and end; its seconds computing, encoding and decoding compressed messages, and
    waiting for parameters or peers."""

    warmup: int = 0
    steps: int = 0
    measured: int = 0
    samples: int = 0
    start: float = 0.0
    end: float = 0.0
    compute_s: float = 0.0
    compress_s: float = 0.0
    wait_s: float = 0.0

    def begin_step(self, t: float, batch: int) -> None:
        if self.steps == self.warmup and self.warmup:  # measured from here on
            self.start, self.samples, self.measured = t, 0, 0
            self.compute_s = self.compress_s = self.wait_s = 0.0
        self.steps += 1
        self.measured += 1
        self.samples += batch

    @property
    def samples_per_s(self) -> float:
        return self.samples / (self.end - self.start) if self.end > self.start else 0.0


@dataclass
class SimResult:
    """A simulated run: throughput (cluster total, as a run's summary counts it: each
    worker's samples over its own time, added up), the mean iteration time, idleness (wait
    over time, mean over workers), the staleness of applied gradients, each host's bytes
    sent and received, each server's busy share and the weight updates."""

    strategy: str
    workers: int
    servers: int
    logs: list[WorkerLog]
    makespan_s: float
    staleness: Counter = field(default_factory=Counter)
    sent: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    server_busy_s: list[float] = field(default_factory=list)
    weight_updates: int = 0

    @property
    def samples_per_s(self) -> float:
        return sum(log.samples_per_s for log in self.logs)

    @property
    def iteration_s(self) -> float:
        steps = sum(log.measured for log in self.logs)
        return sum(log.end - log.start for log in self.logs) / steps if steps else 0.0

    @property
    def compress_s(self) -> float:
        """A worker's seconds encoding and decoding per step (the mean over its steps)."""
        steps = sum(log.measured for log in self.logs)
        return sum(log.compress_s for log in self.logs) / steps if steps else 0.0

    @property
    def idleness(self) -> float:
        shares = [log.wait_s / (log.end - log.start) for log in self.logs
                  if log.end > log.start]
        return sum(shares) / len(shares) if shares else 0.0

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness.values())
        return sum(s * n for s, n in self.staleness.items()) / total if total else 0.0

    @property
    def server_load(self) -> list[float]:
        return [b / self.makespan_s if self.makespan_s else 0.0 for b in self.server_busy_s]

    def summary(self) -> dict:
        """The figures as plain values (`polyrhythm simulate --json`)."""
        return {"strategy": self.strategy, "workers": self.workers, "servers": self.servers,
                "samples_per_s": self.samples_per_s, "iteration_s": self.iteration_s,
                "idleness": self.idleness, "compress_s": self.compress_s,
                "staleness_mean": self.staleness_mean,
                "staleness_max": max(self.staleness, default=0),
                "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
                "weight_updates": self.weight_updates, "makespan_s": self.makespan_s,
                "bytes_sent_per_host": self.sent, "bytes_received_per_host": self.received,
                "server_load": self.server_load}
