"""Links: every host has one full-duplex link of its own rate each way, and a message holds the
sender's outgoing side and the receiver's incoming side while it crosses.

A message from host a to host b of m bytes leaves when a's outgoing side is free (messages
from one host go one after another), crosses at a's rate, and is taken in at b's rate once
b's incoming side is free: many senders to one receiver (workers pushing to one server)
queue on the receiver's side, which is the contention a parameter server meets. It arrives a
one-way latency later. Messages between ranks on one host cost nothing (memory). Messages a
host sends at one instant (a server answering every worker a round released) share its
outgoing side fairly, as TCP flows do: each finishes when the link has carried, for every
message, as much of it as of this one, so equal replies all arrive together rather than one
after another.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable


class Network:
    """Per-host link state and traffic counters."""

    __slots__ = ("seconds_per_byte", "latency", "fixed_latency", "out_free", "in_free", "sent",
                 "received")

    def __init__(self, rates: list[float], latency: Callable[[], float],
                 fixed_latency: float | None = None) -> None:
        """`rates`: bytes/s of each host's link each way (inf: unlimited); `latency`: draws
        one message's extra one-way latency in seconds (`fixed_latency`: it is always
        that)."""
        self.seconds_per_byte = [0.0 if math.isinf(r) else 1.0 / r for r in rates]
        self.latency = latency
        self.fixed_latency = fixed_latency
        self.out_free = [0.0] * len(rates)  # when each host's outgoing side is next free
        self.in_free = [0.0] * len(rates)
        self.sent = [0] * len(rates)  # bytes, per host
        self.received = [0] * len(rates)

    def send(self, t: float, a: int, b: int, nbytes: int) -> float:
        """Send `nbytes` from host a to host b at time t (or once a's link is free); the
        time it arrives."""
        if a == b:
            return t
        self.sent[a] += nbytes
        self.received[b] += nbytes
        # The simulator's innermost call: conditional expressions, not max(), for speed.
        free = self.out_free[a]
        start = t if t > free else free
        left = start + nbytes * self.seconds_per_byte[a]
        self.out_free[a] = left
        free = self.in_free[b]
        taken = (start if start > free else free) + nbytes * self.seconds_per_byte[b]
        if left > taken:
            taken = left
        self.in_free[b] = taken
        if self.fixed_latency is None:
            return taken + self.latency()
        return taken + self.fixed_latency  # no draw to make

    def send_together(self, t: float, a: int, messages: list[tuple[int, int]]) -> list[float]:
        """Send several messages (receiver host, bytes) from host a at once, sharing a's
        outgoing side fairly; the time each arrives."""
        if len(messages) < 2:
            return [self.send(t, a, b, n) for b, n in messages]
        free = self.out_free[a]
        start = t if t > free else free
        per_byte = self.seconds_per_byte[a]
        # Fair sharing from one start: a message is done once the link has carried, of
        # every message, as much as of it (the smaller ones whole): in size order, the
        # bytes of the smaller sizes plus its size for each message of its size or larger.
        sizes = Counter(n for b, n in messages if b != a)
        carried, before, going = {}, 0, sizes.total()
        for n in sorted(sizes):
            carried[n] = before + n * going
            before += n * sizes[n]
            going -= sizes[n]
        self.sent[a] += before  # every remote message's bytes
        received, in_free, seconds_per_byte = self.received, self.in_free, self.seconds_per_byte
        latency, fixed = self.latency, self.fixed_latency
        arrivals = []
        for b, nbytes in messages:
            if a == b:
                arrivals.append(t)
                continue
            received[b] += nbytes
            left = start + per_byte * carried[nbytes]
            free = in_free[b]
            taken = (start if start > free else free) + nbytes * seconds_per_byte[b]
            taken = left if left > taken else taken
            in_free[b] = taken
            arrivals.append(taken + (latency() if fixed is None else fixed))
        self.out_free[a] = start + per_byte * before
        return arrivals

    def latencies(self, count: int):
        """`count` messages' latencies at once (a number, if every one is the same)."""
        if self.fixed_latency is not None:
            return self.fixed_latency
        return [self.latency() for _ in range(count)]
