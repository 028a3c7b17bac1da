"""Consistency policies as pure logic: no processes, arbitrary interleavings (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from polyrhythm.strategies.consistency import (
    AsynchronousPolicy,
    BulkSynchronousPolicy,
    Decision,
    StaleSynchronousPolicy,
)


class Cluster:
    """Drives a policy the way the server loop does: running workers push, released ones go on.

    `choices` picks which running worker pushes next, so hypothesis explores interleavings.
    Every worker makes `steps` pushes, then leaves (on_done).
    """

    def __init__(self, policy, workers: int, steps: int) -> None:
        self.policy, self.steps = policy, steps
        self.clock = [0] * workers
        self.running = set(range(workers))
        self.done: set[int] = set()
        self.decisions: list[Decision] = []

    def push(self, choice: int) -> int:
        worker = sorted(self.running)[choice % len(self.running)]
        self.running.discard(worker)
        self.clock[worker] += 1
        self._apply(self.policy.on_push(worker, self.clock[worker]))
        return worker

    def _apply(self, decision: Decision) -> None:
        self.decisions.append(decision)
        for w in decision.release:
            assert w not in self.running, "released a worker that was not waiting"
            if self.clock[w] == self.steps:
                self.done.add(w)
                self._apply(self.policy.on_done(w))
            else:
                self.running.add(w)

    def run(self, choices: list[int], check=lambda cluster: None) -> None:
        for choice in choices:
            if not self.running:
                break
            self.push(choice)
            check(self)
        while self.running:  # finish deterministically
            self.push(0)
            check(self)
        assert len(self.done) == len(self.clock), "workers left blocked forever (deadlock)"


interleavings = st.lists(st.integers(0, 1000), max_size=200)


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), staleness=st.integers(0, 5), steps=st.integers(1, 12),
       choices=interleavings)
def test_ssp_no_worker_runs_more_than_s_clocks_ahead_of_the_slowest(workers, staleness, steps,
                                                                    choices):
    def bounded(cluster: Cluster) -> None:
        active = [w for w in range(workers) if w not in cluster.done]
        if not active:
            return
        slowest = min(cluster.clock[w] for w in active)
        for w in cluster.running:
            assert cluster.clock[w] - slowest <= staleness

    Cluster(StaleSynchronousPolicy(workers, staleness), workers, steps).run(choices, bounded)


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_ssp_with_zero_staleness_releases_exactly_as_bsp(workers, steps, choices):
    ssp = Cluster(StaleSynchronousPolicy(workers, 0), workers, steps)
    bsp = Cluster(BulkSynchronousPolicy(workers), workers, steps)
    ssp.run(choices)
    bsp.run(choices)
    assert [d.release for d in ssp.decisions] == [d.release for d in bsp.decisions]


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_ssp_with_huge_staleness_behaves_as_asp(workers, steps, choices):
    ssp = Cluster(StaleSynchronousPolicy(workers, 10**9), workers, steps)
    asp = Cluster(AsynchronousPolicy(workers), workers, steps)
    ssp.run(choices)
    asp.run(choices)
    assert [(d.update, d.release) for d in ssp.decisions] == [
        (d.update, d.release) for d in asp.decisions]


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_bsp_applies_one_update_per_round_from_all_workers(workers, steps, choices):
    cluster = Cluster(BulkSynchronousPolicy(workers), workers, steps)
    cluster.run(choices)
    pushes = [d for d in cluster.decisions if d.accumulate]
    updates = [d for d in cluster.decisions if d.update]
    assert len(pushes) == workers * steps
    assert len(updates) == steps
    assert all(d.release == tuple(range(workers)) for d in updates)


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_asp_applies_every_push_and_releases_only_the_pusher(workers, steps, choices):
    cluster = Cluster(AsynchronousPolicy(workers), workers, steps)
    cluster.run(choices)
    pushes = [d for d in cluster.decisions if d.accumulate]
    assert len(pushes) == workers * steps
    assert all(d.update and len(d.release) == 1 for d in pushes)


def test_ssp_holds_a_fast_worker_until_the_slowest_catches_up():
    policy = StaleSynchronousPolicy(workers=2, staleness=1)
    assert policy.on_push(0, 1).release == (0,)  # 1 ahead of worker 1: allowed
    assert policy.on_push(0, 2).release == ()  # 2 ahead: held
    assert policy.on_push(1, 1).release == (0, 1)  # the slowest moved: both go on


def test_a_leaving_worker_no_longer_holds_others_back():
    policy = StaleSynchronousPolicy(workers=2, staleness=0)
    assert policy.on_push(0, 1).release == ()
    assert policy.on_done(1).release == (0,)
