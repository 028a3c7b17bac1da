"""Collective strategies, simulated: the workers all-reduce along the real schedules.

Every worker computes its step, then the workers run the all-reduce schedule of layout.py
(the one comm/collectives.py executes) round by round: a member sends what its round says
once the previous round is done, and finishes the round once its sends are out and its
receives are in, adding what it receives (its share of R_w). Then it steps its optimizer
copy (U_w). `allreduce`, Gloo's own, is simulated as the ring. Local SGD all-reduces the
model every tau steps and steps on its own in between. Under compression a step that
all-reduces first encodes (its seconds), and the all-reduce is the compressor's collectives
one after the other (sim/compressed.py): an all-reduce of the summand's values, or an
all-gather of every member's message by the same algorithm's gather schedule
(layout.GATHERS), or PowerSGD's two.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from polyrhythm.layout import ALGORITHMS, GATHERS, RECV_ADD, SEND
from polyrhythm.sim.compressed import Part
from polyrhythm.sim.network import Network
from polyrhythm.sim.result import SimResult, WorkerLog
from polyrhythm.sim.setup import Setup

# A round: its messages (sender, receiver, bytes) and each member's values to add.
Round = tuple[list[tuple[int, int, int]], dict[int, int]]


def schedule_of(algorithm: str, part: Part):
    """The schedule function of one collective: the algorithm's all-reduce, or its
    all-gather where the part is gathered."""
    return (GATHERS if part.gather else ALGORITHMS)[algorithm]


def rounds_of(algorithm: str, n: int, part: Part) -> list[Round]:
    """Every member's schedule, round by round (the ring: see ring_rounds)."""
    schedules = [schedule_of(algorithm, part)(n, i, part.values) for i in range(n)]
    built = []
    for r in range(max((len(s) for s in schedules), default=0)):
        sends, adds = [], {}
        for i, schedule in enumerate(schedules):
            for op in schedule[r] if r < len(schedule) else ():
                if op.op == SEND:
                    sends.append((i, op.peer, op.numel * part.value_bytes))
                elif op.op == RECV_ADD:
                    adds[i] = adds.get(i, 0) + op.numel
        built.append((sends, adds))
    return built


def ring_rounds(n: int, part: Part) -> list[tuple[int, int]]:
    """The ring's rounds as (bytes each member sends to the next, values it adds). The ring
    is the same for every member up to a rotation, so they come from member 0's schedule
    (sizes differ by one value at most), not from N schedules of 2(N-1) rounds each."""
    return [(sum(op.numel for op in ops if op.op == SEND) * part.value_bytes,
             sum(op.numel for op in ops if op.op == RECV_ADD))
            for ops in schedule_of("ring", part)(n, 0, part.values)]


def plan(algorithm: str, hosts: list[int], part: Part, apart: bool = True) -> tuple:
    """One collective's rounds, made once for the run, and the function that runs them. A
    ring whose members each have a host of their own runs a round at a time for all of
    them (_ring_apart; `apart=False`: member by member, as any other schedule)."""
    n = len(hosts)
    if algorithm != "ring":
        return rounds_of(algorithm, n, part), _all_reduce
    rounds = ring_rounds(n, part)
    if apart and len(set(hosts)) == n:
        return rounds, _ring_apart
    return [([(i, (i + 1) % n, size) for i in range(n)],
             dict.fromkeys(range(n), adds) if adds else {}) for size, adds in rounds], _all_reduce


def simulate_collective(setup: Setup, name: str, algorithm: str, every: int = 1,
                        phase: tuple[int, int] | None = None,
                        net: Network | None = None, start: list[float] | None = None,
                        logs: list[WorkerLog] | None = None) -> SimResult:
    """Simulate synchronous all-reduce SGD (every = 1) or local SGD (all-reduce the model
    every `every` steps), steps [a, b) of `phase` (default: all), from each worker's time
    `start` on `net` (Strategy-Switch runs a collective phase, then a PS one)."""
    n = setup.workers
    net = net or setup.network()
    logs = logs or [WorkerLog(setup.warmup) for _ in range(n)]
    first, last = phase or (0, setup.iterations)
    algorithm = "ring" if algorithm == "native" else algorithm
    hosts = [setup.worker_host(i) for i in range(n)]
    per_value = setup.costs.reduce_s / max(1, setup.costs.parameters)
    plans = [plan(algorithm, hosts, part) for part in setup.parts]
    encoding = setup.codecs.reduce
    t = list(start or [0.0] * n)
    for step in range(first, last):
        exchanges = (step + 1) % every == 0 and n > 1
        ready = []
        for i in range(n):
            seconds = setup.compute[i]()
            logs[i].begin_step(t[i], setup.batch[i])  # first: it zeroes the warm-up's
            logs[i].compute_s += seconds
            if exchanges and encoding:
                logs[i].compress_s += encoding
                seconds += encoding
            ready.append(t[i] + seconds)
        if exchanges:
            done = ready
            for rounds, reduce in plans:
                done = reduce(net, rounds, done, hosts, per_value, setup.costs.message_s)
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


def _ring_apart(net: Network, rounds: list[tuple[int, int]], ready: list[float],
                hosts: list[int], per_value: float, message_s: float) -> list[float]:
    """The ring with every member on a host of its own, a round at a time for all members
    at once (numpy): each link carries one message a round, so no two messages of a round
    meet, and the members need not go one by one (1,024 members: 2,046 rounds a step)."""
    h = np.array(hosts)
    to = np.roll(h, -1)  # member i's next member's host
    per_byte = np.array(net.seconds_per_byte)
    out_free, in_free = np.array(net.out_free), np.array(net.in_free)
    ready_now = np.array(ready)
    sent = 0
    for size, adds in rounds:
        start = np.maximum(ready_now + message_s, out_free[h])
        left = start + size * per_byte[h]
        out_free[h] = left
        taken = np.maximum(left, np.maximum(start, in_free[to]) + size * per_byte[to])
        in_free[to] = taken
        arrives = taken + net.latencies(len(hosts))
        ready_now = np.maximum(left, np.roll(arrives, 1)) + adds * per_value
        sent += size
    net.out_free[:], net.in_free[:] = out_free.tolist(), in_free.tolist()
    for a, b in zip(hosts, to.tolist(), strict=True):
        net.sent[a] += sent
        net.received[b] += sent
    return ready_now.tolist()
