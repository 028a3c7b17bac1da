"""Worker cadences as pure rules: when to push, fetch, average and gossip, with no process."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from polyrhythm.strategies.cadence import GossipCoin, Periodic, PushFetch
from polyrhythm.strategies.consistency import AsynchronousPolicy


def test_periodic_fires_every_tau_steps_and_owes_the_rest():
    tau = Periodic(3)
    fired = [step for step in range(1, 11) if tau.step()]
    assert fired == [3, 6, 9]
    assert tau.owed  # step 10 came after the last averaging
    exact = Periodic(5)
    assert [exact.step() for _ in range(5)] == [False] * 4 + [True] and not exact.owed


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 60))
def test_push_fetch_is_downpours_schedule(push_every, fetch_every, steps):
    cadence = PushFetch(push_every, fetch_every)
    actions = [cadence.step() for _ in range(steps)]
    assert [s for s, (push, _) in enumerate(actions, 1) if push] == list(
        range(push_every, steps + 1, push_every))
    assert [s for s, (_, fetch) in enumerate(actions, 1) if fetch] == list(
        range(fetch_every, steps + 1, fetch_every))
    assert cadence.pushes == steps // push_every
    # The gradients of the steps after the last push are pushed at the end, as one more.
    assert cadence.final_push() == (steps % push_every != 0)
    assert cadence.pushes == -(-steps // push_every)


def test_push_fetch_with_an_asynchronous_policy_counts_updates_without_processes():
    # What a simulator does: 2 Downpour workers' cadences drive the server's policy.
    policy, cadences = AsynchronousPolicy(2), [PushFetch(2, 3), PushFetch(2, 3)]
    updates = 0
    for _ in range(18):
        for worker, cadence in enumerate(cadences):
            push, _ = cadence.step()
            if push:
                updates += policy.on_push(worker, cadence.pushes).update
    assert updates == 2 * 9  # every push its own update (test_strategies checks a real run)


def test_gossip_coin_is_seeded_per_worker_and_fair():
    steps = 20_000
    coin = GossipCoin(0.2, peers=3, seed=0, worker=1)
    draws = [coin.step() for _ in range(steps)]
    sent = [d for d in draws if d is not None]
    assert abs(len(sent) / steps - 0.2) < 4 * (0.2 * 0.8 / steps) ** 0.5
    assert set(Counter(sent)) == {0, 1, 2}
    assert min(Counter(sent).values()) > len(sent) / 3 * 0.9
    again = GossipCoin(0.2, peers=3, seed=0, worker=1)
    assert [again.step() for _ in range(steps)] == draws
    other = GossipCoin(0.2, peers=3, seed=0, worker=2)
    assert [other.step() for _ in range(100)] != draws[:100]
    assert all(GossipCoin(1.0, peers=0, seed=0, worker=0).step() is None for _ in range(5))


def test_cadences_carry_on_from_their_state():
    for make in (lambda: Periodic(4), lambda: PushFetch(2, 3),
                 lambda: GossipCoin(0.5, peers=4, seed=3, worker=0)):
        first = make()
        for _ in range(7):
            first.step()
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        assert [resumed.step() for _ in range(20)] == [first.step() for _ in range(20)]
