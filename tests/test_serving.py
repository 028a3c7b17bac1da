"""What a parameter server does with a message is decided once (strategies/serving.py): the
real server and the simulator, given the same messages, make the same decisions
(tests/test_sim.py: a simulated run with shared epochs ends where a real one does)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch

from polyrhythm.comm.messages import PUSH_HEADER
from polyrhythm.config import make_config
from polyrhythm.context import RankContext, Topology
from polyrhythm.runtime.server import server as real_server
from polyrhythm.runtime.server.server import ParameterServerShard
from polyrhythm.sim.ps import SimulatedBucket
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.serving import DONE, FETCH, GRADIENT, PUSH, Course

P, G, F, D = PUSH, GRADIENT, FETCH, DONE


def wire(weight: float) -> float:
    """A batch weight as a push's float32 header carries it to the server."""
    return torch.tensor(weight, dtype=torch.float32).item()


@dataclass
class Scenario:
    """A recorded message sequence for one bucket layout, and what it must lead to."""

    strategy: dict  # the run's strategy and its settings (the policy both sides build)
    workers: int
    weights: list[float]  # each worker's batch weight
    messages: list[tuple]  # (kind, worker, clock, pulled[, bucket])
    releases: list[tuple]  # the workers answered after each message
    versions: list[int]  # bucket 0's version after each message
    steps_per_epoch: int = 100  # the run's global batches (1 epoch)
    shared_epochs: bool = False
    buckets: dict[int, tuple[int, int]] = field(default_factory=lambda: {0: (0, 6)})
    ends_at: int | None = None  # the message whose update ends the run
    scales: dict[int, float] = field(default_factory=dict)  # message -> its push's scale


THIRDS = [wire(1 / 3)] * 3
SCENARIOS = {
    # A round of every worker is one update; a leaving worker closes the round it held up.
    "bsp": Scenario(
        {"strategy": "bsp"}, 3, THIRDS,
        [(P, 0, 1, 0), (P, 1, 1, 0), (P, 2, 1, 0), (P, 1, 2, 1), (P, 0, 2, 1), (P, 2, 2, 1),
         (P, 0, 3, 2), (P, 1, 3, 2), (D, 2, 0, 0), (D, 0, 0, 0), (D, 1, 0, 0)],
        [(), (), (0, 1, 2), (), (), (0, 1, 2), (), (), (0, 1), (), ()],
        [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]),
    # Shared epochs: the run (1 global batch) ends on the batch weights applied (22 + 21 +
    # 21 of 64 is not yet one; a fourth push is), whoever pushed them; later work is cancelled
    # and a fetch still answered.
    "asp shared epochs": Scenario(
        {"strategy": "asp"}, 3, [wire(22 / 64), wire(21 / 64), wire(21 / 64)],
        [(P, 1, 1, 0), (P, 2, 1, 0), (P, 1, 2, 1), (P, 2, 2, 2), (P, 0, 1, 0), (F, 1, 2, 3),
         (D, 0, 0, 0), (D, 1, 0, 0), (D, 2, 0, 0)],
        [(1,), (2,), (1,), (2,), (0,), (1,), (), (), ()],
        [1, 2, 3, 4, 4, 4, 4, 4, 4], steps_per_epoch=1, shared_epochs=True, ends_at=3),
    # At most 1 clock ahead of the slowest: worker 0's second push waits for the others.
    "ssp": Scenario(
        {"strategy": "ssp", "staleness": 1}, 3, THIRDS,
        [(P, 0, 1, 0), (P, 0, 2, 1), (P, 1, 1, 0), (P, 2, 1, 0), (D, 1, 0, 0), (D, 0, 0, 0),
         (D, 2, 0, 0)],
        [(0,), (), (1,), (0, 2), (), (), ()],
        [1, 2, 3, 4, 4, 4, 4]),
    # 2 of 3 fresh gradients make an update, a stale one is dropped; after 2 rounds the run
    # is over and the last worker's gradient cancelled.
    "kbsp": Scenario(
        {"strategy": "kbsp", "quorum": 2}, 3, THIRDS,
        [(P, 0, 1, 0), (P, 1, 1, 0), (P, 2, 1, 0), (P, 0, 2, 1), (P, 2, 2, 1), (P, 1, 2, 1),
         (D, 0, 0, 0), (D, 1, 0, 0), (D, 2, 0, 0)],
        [(), (0, 1), (2,), (), (0, 2), (1,), (), (), ()],
        [0, 1, 1, 1, 2, 2, 2, 2, 2], steps_per_epoch=2, ends_at=4),
    # Staleness-aware: a gradient 2 updates old steps at half the rate, one 3 old at the
    # floor (0.4 > 1/3); the leaving workers let the last one's update through.
    "softsync": Scenario(
        {"strategy": "softsync", "quorum": 2, "lr_floor": 0.4}, 3, THIRDS,
        [(P, 0, 1, 0), (P, 1, 1, 0), (P, 0, 2, 1), (P, 1, 2, 1), (P, 2, 1, 0), (P, 0, 3, 2),
         (P, 1, 3, 2), (P, 0, 4, 3), (P, 0, 5, 4), (P, 1, 4, 4), (P, 0, 6, 5), (P, 1, 5, 5),
         (P, 2, 2, 3), (D, 0, 0, 0), (D, 1, 0, 0), (D, 2, 0, 0)],
        [(), (0, 1), (), (0, 1), (), (0, 2), (), (0, 1), (), (0, 1), (), (0, 1), (), (),
         (2,), ()],
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 7, 7], scales={4: 0.5, 12: 0.4}),
    # EASGD: fetch the centre, then push the elastic difference without waiting.
    "easgd": Scenario(
        {"strategy": "easgd"}, 2, [1.0, 1.0],
        [(F, 0, 1, 0), (G, 0, 1, 0), (F, 1, 1, 0), (G, 1, 1, 1), (D, 0, 0, 0), (D, 1, 0, 0)],
        [(0,), (), (1,), (), (), ()],
        [0, 1, 1, 2, 2, 2]),
    # Downpour on two buckets: a push without a fetch is answered to nobody, a fetch alone
    # answered whatever the policy.
    "downpour, two buckets": Scenario(
        {"strategy": "downpour", "push_every": 2, "fetch_every": 3}, 2, [0.5, 0.5],
        [(G, 0, 1, 0, 0), (G, 0, 1, 0, 1), (P, 1, 1, 0, 1), (P, 1, 1, 0, 0), (F, 0, 1, 0, 0),
         (F, 0, 1, 0, 1), (D, 0, 0, 0, 0), (D, 0, 0, 0, 1), (D, 1, 0, 0, 1), (D, 1, 0, 0, 0)],
        [(), (), (1,), (1,), (0,), (0,), (), (), (), ()],
        [1, 1, 1, 2, 2, 2, 2, 2, 2, 2], buckets={0: (0, 4), 1: (4, 10)}),
}


class Replay:
    """In place of the transport: hands the server the recorded messages, one at a time
    (each with a gradient), and records what it sends and its buckets after each message."""

    def __init__(self, scenario: Scenario, servers: int) -> None:
        self.scenario, self.servers = scenario, servers
        self.shard: ParameterServerShard | None = None
        self.next = 0
        self.replies: list[list[tuple]] = []  # after each message: (worker, bucket, version, over)
        self.states: list[list[tuple]] = []  # after each message: every bucket's counts
        self.values = torch.Generator().manual_seed(0)

    def receiver(self, sources: list[int], numel: int, tag: int = 0):
        self.numel = numel
        return self

    def take(self, block: bool = True) -> tuple[int, torch.Tensor]:
        self._took()
        kind, worker, clock, pulled, *key = self.scenario.messages[self.next]
        self.next += 1
        inbox = torch.randn(self.numel, generator=self.values)
        inbox[:PUSH_HEADER] = torch.tensor([kind, clock, pulled,
                                            self.scenario.weights[worker], *(key or [0])])
        self.replies.append([])
        return self.servers + worker, inbox

    def _took(self) -> None:
        if self.replies:  # the message before is done with
            self.states.append(counts(self.shard.buckets))

    def waiting(self) -> int:
        return 0

    def release(self, src: int, more: bool = True) -> None:
        pass

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        version, over, _ = tensor[:3].tolist()
        self.replies[-1].append((dst - self.servers, tag, int(version), bool(over)))
        return None  # sent at once: nothing to wait for


def counts(buckets) -> list[tuple]:
    return [(b.version, bool(b.over), b.progress, b.pending_weight) for b in buckets.values()]


def real_server_run(scenario: Scenario, config, monkeypatch) -> tuple[list, Replay, Counter]:
    """The real server's loop (ParameterServerShard.run) over the recorded messages: what
    it decided for each (the serve calls it made), its replies and counts."""
    decided, serve = [], real_server.serve

    def spy(*args):
        served = serve(*args)
        decided.append((args[2:], served))
        return served

    monkeypatch.setattr(real_server, "serve", spy)
    replay = Replay(scenario, servers=1)
    ctx = RankContext(config, 0, Topology(1, scenario.workers), transport=replay)
    initial = torch.randn(max(b for _, b in scenario.buckets.values()))
    spec = STRATEGIES[config.strategy.name]
    shard = ParameterServerShard(ctx, initial, scenario.buckets,
                                 max(b - a for a, b in scenario.buckets.values()),
                                 lambda: spec.policy(config.strategy, scenario.workers),
                                 spec.server_updates(config.strategy, scenario.workers),
                                 scenario.steps_per_epoch)
    replay.shard = shard
    shard.run()
    replay._took()
    monkeypatch.undo()
    return decided, replay, Counter(shard.staleness.histogram)


def simulated_servers(scenario: Scenario, config) -> tuple[list, list, list, Counter]:
    """The simulator's buckets over the same messages: their decisions, answers and counts."""
    spec = STRATEGIES[config.strategy.name]
    buckets = {k: SimulatedBucket(spec.policy(config.strategy, scenario.workers))
               for k in scenario.buckets}
    course = Course(scenario.steps_per_epoch, config.shared_epochs)
    decided, replies, states, staleness = [], [], [], Counter()
    for kind, worker, clock, pulled, *key in scenario.messages:
        bucket = buckets[key[0] if key else 0]
        message = (kind, worker, clock, pulled, scenario.weights[worker])
        served = bucket.take(course, *message)
        decided.append((message, served))
        replies.append([(r, key[0] if key else 0, bucket.version, bucket.over)
                        for r in served.decision.release])
        states.append(counts(buckets))
        if served.staleness is not None:
            staleness[served.staleness] += 1
    return decided, replies, states, staleness


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_real_server_and_the_simulator_decide_alike(name, monkeypatch):
    scenario = SCENARIOS[name]
    config = make_config({**scenario.strategy, "workers": scenario.workers, "epochs": 1,
                          "shared_epochs": scenario.shared_epochs})
    real, replay, real_staleness = real_server_run(scenario, config, monkeypatch)
    simulated, replies, states, staleness = simulated_servers(scenario, config)
    # The same messages reached the decision (the real one as parsed from its header), and
    # every decision is the same: accumulate and its scale, update, release, staleness, end.
    assert real == simulated
    assert replay.replies == replies
    assert replay.states == states
    assert real_staleness == staleness
    # What the messages must lead to.
    assert [tuple(w for w, *_ in sent) for sent in replies] == scenario.releases
    assert [state[0][0] for state in states] == scenario.versions
    ends = [i for i, (_, served) in enumerate(simulated) if served.ends]
    assert ends == ([] if scenario.ends_at is None else [scenario.ends_at])
    over = [any(b[1] for b in state) for state in states]
    assert over == [scenario.ends_at is not None and i >= scenario.ends_at
                    for i in range(len(states))]
    scales = {i: served.decision.scale for i, (_, served) in enumerate(simulated)
              if served.decision.scale != 1.0}
    assert scales == scenario.scales
