"""Worker-side cadences: when a worker communicates. Pure rules, no I/O, no tensors.

The consistency policies (consistency.py) decide on the servers what a push does; these
decide on the workers when to push, fetch, average or gossip. Each is called once per
training step and answers what this step does; the worker strategies act on the answer, and
a simulator can call the same objects without processes. Steps count from 1.
"""

from __future__ import annotations

import math

import numpy as np


class Periodic:
    """Fires on every `every`-th step: local SGD's and EASGD's tau, Downpour's push and
    fetch periods. A run may end between two firings: `owed` says that steps were taken
    since the last one (local SGD then averages once more, EASGD exchanges once more)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.steps = 0

    def step(self) -> bool:
        """Take a step; True if this step communicates."""
        self.steps += 1
        return self.steps % self.every == 0

    @property
    def owed(self) -> bool:
        return self.steps % self.every != 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


class PushFetch:
    """A parameter-server worker's rule (Dean et al., "Large Scale Distributed Deep
    Networks", NIPS 2012, Downpour SGD): push the gradients accumulated since the last push
    every `push_every` steps, fetch the parameters every `fetch_every` steps. 1 and 1 is the
    usual push-and-pull of every step. `pushes` counts the pushes made: the worker's clock."""

    def __init__(self, push_every: int = 1, fetch_every: int = 1) -> None:
        self.push = Periodic(push_every)
        self.fetch = Periodic(fetch_every)
        self.pushes = 0

    def step(self) -> tuple[bool, bool]:
        """Take a step; (push, fetch) for it."""
        push, fetch = self.push.step(), self.fetch.step()
        self.pushes += push
        return push, fetch

    def cycle(self) -> list[tuple[bool, bool]]:
        """Take the next lcm(push_every, fetch_every) steps: their answers, which the steps
        after them repeat. A simulator replays them rather than asking a million times."""
        return [self.step() for _ in range(math.lcm(self.push.every, self.fetch.every))]

    def final_push(self) -> bool:
        """At the end: were gradients accumulated since the last push? Then they are pushed,
        as one more push."""
        owed = self.push.owed
        self.pushes += owed
        return owed

    def state_dict(self) -> dict:
        return {"push": self.push.state_dict(), "fetch": self.fetch.state_dict(),
                "pushes": self.pushes}

    def load_state_dict(self, state: dict) -> None:
        self.push.load_state_dict(state["push"])
        self.fetch.load_state_dict(state["fetch"])
        self.pushes = state["pushes"]


class GossipCoin:
    """GoSGD's rule (Blot, Picard, Cord and Thome, "Gossip training for deep learning",
    2016): after each step, with probability p, send to one of the other `peers` workers
    drawn uniformly. Seeded per worker, so a run's gossip is reproducible."""

    def __init__(self, p: float, peers: int, seed: int, worker: int) -> None:
        self.p, self.peers = p, peers
        self.rng = np.random.default_rng([seed, worker])

    def step(self) -> int | None:
        """Take a step; the index (0 .. peers-1) of the peer to send to, or None."""
        if self.peers and self.rng.random() < self.p:
            return int(self.rng.integers(self.peers))
        return None

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
