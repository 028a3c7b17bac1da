"""Collective strategies, simulated: the workers all-reduce along the real schedules.

Every worker computes its step, then the workers run the all-reduce schedule of layout.py
(the one comm/collectives.py executes) round by round: a member sends what its round says
once the previous round is done, and finishes the round once its sends are out and its
receives are in, adding what it receives (its share of R_w). Then it steps its optimizer
copy (U_w). `allreduce`, Gloo's own, is simulated as the ring. Local SGD all-reduces the
model every tau steps and steps on its own in between.
"""

from __future__ import annotations

from collections import Counter

from polyrhythm.layout import ALGORITHMS, RECV_ADD, SEND, ring_schedule
from polyrhythm.sim.network import Network
from polyrhythm.sim.result import SimResult, WorkerLog
from polyrhythm.sim.setup import BYTES, Setup

# A round: its messages (sender, receiver, bytes) and each member's values to add.
Round = tuple[list[tuple[int, int, int]], dict[int, int]]


def rounds_of(algorithm: str, n: int, numel: int) -> list[Round]:
    """Every member's schedule, round by round. The ring is the same for every member up
    to a rotation, so its rounds are built from member 0's (sizes differ by one value at
    most), not from N schedules of 2(N-1) rounds each."""
    if algorithm == "ring":
        built = []
        for ops in ring_schedule(n, 0, numel):
            send = next(op for op in ops if op.op == SEND)
            adds = sum(op.numel for op in ops if op.op == RECV_ADD)
            built.append(([(i, (i + 1) % n, send.numel * BYTES) for i in range(n)],
                          dict.fromkeys(range(n), adds) if adds else {}))
        return built
    schedules = [ALGORITHMS[algorithm](n, i, numel) for i in range(n)]
    built = []
    for r in range(max((len(s) for s in schedules), default=0)):
        sends, adds = [], {}
        for i, schedule in enumerate(schedules):
            for op in schedule[r] if r < len(schedule) else ():
                if op.op == SEND:
                    sends.append((i, op.peer, op.numel * BYTES))
                elif op.op == RECV_ADD:
                    adds[i] = adds.get(i, 0) + op.numel
        built.append((sends, adds))
    return built


def simulate_collective(setup: Setup, name: str, algorithm: str, every: int = 1,
                        phase: tuple[int, int] | None = None,
                        net: Network | None = None, start: list[float] | None = None,
                        logs: list[WorkerLog] | None = None) -> SimResult:
    """Simulate synchronous all-reduce SGD (every = 1) or local SGD (all-reduce the model
    every `every` steps), steps [a, b) of `phase` (default: all), from each worker's time
    `start` on `net` (Strategy-Switch runs a collective phase, then a PS one)."""
    n = setup.workers
    net = net or Network(setup.rates, setup.latency)
    logs = logs or [WorkerLog(setup.warmup) for _ in range(n)]
    first, last = phase or (0, setup.iterations)
    rounds = rounds_of("ring" if algorithm == "native" else algorithm, n,
                       setup.costs.parameters)
    per_value = setup.costs.reduce_s / max(1, setup.costs.parameters)
    hosts = [setup.worker_host(i) for i in range(n)]
    t = list(start or [0.0] * n)
    for step in range(first, last):
        ready = []
        for i in range(n):
            seconds = setup.compute[i]()
            logs[i].compute_s += seconds
            logs[i].begin_step(t[i], setup.batch[i])
            ready.append(t[i] + seconds)
        if (step + 1) % every == 0 and n > 1:
            done = _all_reduce(net, rounds, ready, hosts, per_value, setup.costs.message_s)
            for i in range(n):
                logs[i].wait_s += done[i] - ready[i]
            ready = done
        t = [r + setup.costs.update_s for r in ready]
    for i in range(n):
        logs[i].end = t[i]
    return SimResult(name, n, 0, logs, max(t), Counter(), net.sent, net.received, [], last)


def _all_reduce(net: Network, rounds: list[Round], ready: list[float], hosts: list[int],
                per_value: float, message_s: float) -> list[float]:
    """Each member's time when the all-reduce is done, from when each was ready; a
    message leaves `message_s` after its sender is ready (the sender's own time for it)."""
    ready = list(ready)
    for sends, adds in rounds:
        finished = list(ready)
        for src, dst, size in sorted(sends, key=lambda m: ready[m[0]]):
            arrives = net.send(ready[src] + message_s, hosts[src], hosts[dst], size)
            finished[src] = max(finished[src], net.out_free[hosts[src]])
            finished[dst] = max(finished[dst], arrives)
        for i, numel in adds.items():
            finished[i] += numel * per_value
        ready = finished
    return ready
