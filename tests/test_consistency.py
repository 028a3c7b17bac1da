"""Consistency policies as pure logic: no processes, arbitrary interleavings (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from polyrhythm.strategies.consistency import (
    AsynchronousPolicy,
    BulkSynchronousPolicy,
    Decision,
    QuorumAsynchronousPolicy,
    QuorumSynchronousPolicy,
    SoftSynchronousPolicy,
    StaleSynchronousPolicy,
)


class Cluster:
    """Drives a policy the way the server loop does: running workers push, released ones go on.

    `choices` picks which running worker pushes next, so hypothesis explores interleavings.
    Every worker makes `steps` pushes, then leaves (on_done). The cluster keeps the bucket's
    version (updates applied) and the version each worker pulled, so pushes carry their real
    staleness; `changes` are the max-norm sizes reported for successive updates.
    """

    def __init__(self, policy, workers: int, steps: int, changes=(0.01,)) -> None:
        self.policy, self.steps, self.changes = policy, steps, list(changes)
        self.clock = [0] * workers
        self.running = set(range(workers))
        self.done: set[int] = set()
        self.decisions: list[Decision] = []
        self.push_decisions: list[Decision] = []  # those answering a push (not a leave)
        self.version = 0
        self.pulled = [0] * workers
        self.pending: list[tuple[int, int]] = []  # (worker, staleness) accumulated, not applied
        self.updates: list[list[tuple[int, int]]] = []  # the pushes each update applied
        self.update_versions: list[int] = []  # the version each update was applied to
        self.update_active: list[int] = []  # workers still training when it was applied

    def push(self, choice: int) -> int:
        worker = sorted(self.running)[choice % len(self.running)]
        self.running.discard(worker)
        self.clock[worker] += 1
        staleness = self.version - self.pulled[worker]
        decision = self.policy.on_push(worker, self.clock[worker], staleness)
        if decision.accumulate:
            self.pending.append((worker, staleness))
        self.push_decisions.append(decision)
        self._apply(decision)
        return worker

    def _apply(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if decision.update and self.pending:
            self.updates.append(self.pending)
            self.update_versions.append(self.version)
            self.update_active.append(len(self.clock) - len(self.done))
            self.pending = []
            self.version += 1
            if self.policy.tracks_change:
                self.policy.on_update(self.changes[len(self.updates) % len(self.changes)])
        for w in decision.release:
            assert w not in self.running, "released a worker that was not waiting"
            self.pulled[w] = self.version
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
        assert not self.pending, "gradients accumulated but never applied"


def decisions_of(policies, workers: int, steps: int, choices: list[int], keep=lambda d: d):
    """Each policy driven through the same interleaving: its decisions, mapped by `keep`."""
    runs = []
    for policy in policies:
        cluster = Cluster(policy, workers, steps)
        cluster.run(choices)
        runs.append([keep(d) for d in cluster.decisions])
    return runs


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
    ssp, bsp = decisions_of([StaleSynchronousPolicy(workers, 0), BulkSynchronousPolicy(workers)],
                            workers, steps, choices, lambda d: d.release)
    assert ssp == bsp


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_ssp_with_huge_staleness_behaves_as_asp(workers, steps, choices):
    ssp, asp = decisions_of([StaleSynchronousPolicy(workers, 10**9), AsynchronousPolicy(workers)],
                            workers, steps, choices, lambda d: (d.update, d.release))
    assert ssp == asp


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


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), quorum=st.integers(1, 6), steps=st.integers(1, 10),
       choices=interleavings)
def test_kbsp_applies_at_most_one_update_per_round_from_k_fresh_gradients(
        workers, quorum, steps, choices):
    quorum = min(quorum, workers)
    cluster = Cluster(QuorumSynchronousPolicy(workers, quorum), workers, steps)
    cluster.run(choices)
    # One update per round: never two updates computed from the same parameters.
    assert len(set(cluster.update_versions)) == len(cluster.updates)
    for update in cluster.updates:
        assert all(staleness == 0 for _, staleness in update)  # late gradients were dropped
        assert len({w for w, _ in update}) == len(update) <= quorum
    # Every round had the quorum, or every worker still training.
    assert all(len(u) >= min(quorum, active)
               for u, active in zip(cluster.updates, cluster.update_active, strict=True))
    dropped = [d for d in cluster.push_decisions if not d.accumulate]
    assert all(len(d.release) == 1 and not d.update for d in dropped)  # answered at once
    assert len(dropped) + sum(len(u) for u in cluster.updates) == workers * steps


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_kbsp_with_a_quorum_of_all_workers_is_bsp(workers, steps, choices):
    kbsp, bsp = decisions_of([QuorumSynchronousPolicy(workers, workers),
                              BulkSynchronousPolicy(workers)], workers, steps, choices)
    assert kbsp == bsp


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), quorum=st.integers(1, 6), steps=st.integers(1, 10),
       choices=interleavings)
def test_kasp_uses_every_gradient_k_at_a_time(workers, quorum, steps, choices):
    quorum = min(quorum, workers)
    cluster = Cluster(QuorumAsynchronousPolicy(workers, quorum), workers, steps)
    cluster.run(choices)
    assert sum(len(u) for u in cluster.updates) == workers * steps  # nothing dropped
    assert all(min(quorum, active) <= len(u) <= quorum
               for u, active in zip(cluster.updates, cluster.update_active, strict=True))


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), steps=st.integers(1, 10), choices=interleavings)
def test_kasp_with_quorum_one_is_asp(workers, steps, choices):
    kasp, asp = decisions_of([QuorumAsynchronousPolicy(workers, 1), AsynchronousPolicy(workers)],
                             workers, steps, choices, lambda d: (d.update, d.release))
    assert kasp == asp


@settings(max_examples=300, deadline=None)
@given(workers=st.integers(1, 6), quorum=st.integers(1, 6), floor=st.floats(0.001, 1.0),
       steps=st.integers(1, 10), choices=interleavings)
def test_softsync_never_raises_the_learning_rate_and_keeps_the_floor(
        workers, quorum, floor, steps, choices):
    policy = SoftSynchronousPolicy(workers, min(quorum, workers), floor)
    cluster = Cluster(policy, workers, steps)
    cluster.run(choices)
    scales = [d.scale for d in cluster.decisions if d.accumulate]
    assert all(floor <= s <= 1.0 for s in scales)
    for staleness in range(50):
        assert floor <= policy._scale(staleness) <= 1.0
    assert policy._scale(0) == policy._scale(1) == 1.0
    assert policy._scale(4) == max(floor, 0.25)


changes = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(workers=st.integers(1, 6), staleness=st.integers(0, 4), bound=st.floats(0.01, 2.0),
       steps=st.integers(1, 10), sizes=changes, choices=interleavings)
def test_value_bound_holds_updates_while_unseen_change_exceeds_it_without_deadlock(
        workers, staleness, bound, steps, sizes, choices):
    policy = StaleSynchronousPolicy(workers, staleness, value_bound=bound)
    unseen_before: list[tuple[float, bool]] = []

    def record(cluster: Cluster) -> None:
        active = [w for w in range(workers) if w not in cluster.done]
        # The clock bound of SSP still holds for running workers.
        if active:
            slowest = min(cluster.clock[w] for w in active)
            assert all(cluster.clock[w] - slowest <= staleness for w in cluster.running)

    original = policy._apply_and_release

    def spy(accumulate: bool):
        active = policy.active
        worst = max((policy.unseen[w] for w in active), default=0.0)
        decision = original(accumulate)
        if decision.update:
            unseen_before.append((worst, bool(active) and active <= policy.waiting | set(
                decision.release)))
        return decision

    policy._apply_and_release = spy
    cluster = Cluster(policy, workers, steps, sizes)
    cluster.run(choices, record)  # asserts no deadlock and nothing left unapplied
    # An update is applied over the bound only when every active worker was waiting.
    assert all(worst <= bound or everyone_waiting for worst, everyone_waiting in unseen_before)


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 6), staleness=st.integers(0, 4), steps=st.integers(1, 10),
       choices=interleavings)
def test_a_value_bound_never_reached_changes_nothing(workers, staleness, steps, choices):
    bounded, plain = decisions_of([StaleSynchronousPolicy(workers, staleness, value_bound=1e9),
                                   StaleSynchronousPolicy(workers, staleness)],
                                  workers, steps, choices)
    assert bounded == plain


def test_value_bound_holds_a_push_until_the_slow_worker_has_caught_up():
    policy = StaleSynchronousPolicy(workers=2, staleness=10, value_bound=0.5)
    assert policy.on_push(0, 1) == Decision(update=True, release=(0,))
    policy.on_update(0.6)  # worker 1 has not seen 0.6 of change
    assert policy.on_push(0, 2) == Decision(update=False, release=())  # held
    # The slow worker pushes: everyone is waiting, the held pushes go in with it.
    assert policy.on_push(1, 1) == Decision(update=True, release=(0, 1))
