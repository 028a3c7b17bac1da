"""Server-side consistency policies: pure logic, no I/O, tested without processes.

The server loop (server.py) is written once. For every push it asks its policy a `Decision`:
whether to add the gradient to the pending update (and with what scale), whether to apply the
pending update now, and which waiting workers to answer with the current parameters. Workers
are numbered 0..N-1; a worker's clock is the number of pushes it has made; a push's staleness
is the number of updates applied to the bucket since the worker pulled the parameters its
gradient was computed on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple


class Decision(NamedTuple):
    """What the server does after a push (or after a worker leaves). A value, as a frozen
    dataclass would be, but made in half the time: the simulator makes one per push."""

    accumulate: bool = True  # add this push's weighted gradient to the pending update
    update: bool = False  # apply the pending update as one optimizer step
    release: tuple[int, ...] = ()  # workers to answer now with the current parameters
    scale: float = 1.0  # shrinks this push's step, not its batch weight (staleness-aware lr)


# The answers that only add to the pending update, or do nothing, made once: a policy gives
# one for most pushes, and the simulator asks for a million.
_ACCUMULATE, _NOTHING = Decision(), Decision(accumulate=False)


class ConsistencyPolicy(ABC):
    """Decides when pushes become weight updates and when blocked workers may go on.

    What an update does with the pushes is the strategy's server update's
    (strategies/server_updates/). Attributes tell the server what the policy needs of it:
    - `tracks_change`: call `on_update` with the max-norm of every applied change;
    - `combines`: an update may sum several pushes (the server then adds them in float64, so
      the sum does not depend on the order they arrive in); false where every push is an
      update of its own;
    - `fixed_rounds`: the run is as many updates as BSP would make (steps per epoch x
      epochs), after which the server ends training and workers still computing stop, as in
      k-BSP and backup workers, where a straggler's work is cancelled. Without it a straggler
      would go on alone once the others are done, each of its gradients a round of its own.
    `concurrency` is how many updates are in flight per round of N pushes: 1 when rounds are
    synchronous, N for fully asynchronous servers; asynchrony acts as implicit momentum.
    """

    tracks_change = False
    combines = True
    fixed_rounds = False
    # The survivors of a lost worker still make the same kind of updates: an asynchronous
    # server never waits for any one worker, a quorum still met is still the quorum. A
    # synchronous round without one of its workers is another algorithm (fewer gradients
    # per update), so it goes on only when asked to (on_worker_failure = continue).
    survives_lost_worker = False

    def __init__(self, workers: int) -> None:
        self.active = set(range(workers))
        self.clocks = dict.fromkeys(range(workers), 0)
        self.concurrency = 1.0

    def on_push(self, worker: int, clock: int, staleness: int = 0) -> Decision:
        """Worker `worker` pushed its gradient number `clock` (1-based) and now waits."""
        self.clocks[worker] = clock
        return self._decide(worker, staleness)

    def on_done(self, worker: int) -> Decision:
        """Worker `worker` finished training; it waits for nothing and holds nobody back."""
        self.active.discard(worker)
        return self._decide_after_leave()

    def on_update(self, change: float) -> None:  # noqa: B027 - only value bounds need it
        """The last decided update changed the weights by `change` in max-norm."""

    # What the policy has learnt of the run (its settings come from the config instead).
    STATE: tuple[str, ...] = ("active", "clocks")

    def state_dict(self) -> dict:
        """The run's state as plain values (sets as sorted lists), so it saves without
        pickling Python objects."""
        return {name: sorted(v) if isinstance(v, set | tuple) else
                (dict(v) if isinstance(v, dict) else v)
                for name, v in ((name, getattr(self, name)) for name in self.STATE)}

    def load_state_dict(self, state: dict) -> None:
        for name in self.STATE:
            kind = type(getattr(self, name))
            setattr(self, name, kind(state[name]))

    def _release_if_quorum(self, members: set[int], quorum: int, accumulate: bool,
                           scale: float = 1.0) -> Decision:
        """One update that releases `members` once they number the quorum (or every active
        worker, when fewer are left); else just this push's accumulation."""
        if not members or len(members) < min(quorum, len(self.active)):
            if scale != 1.0:
                return Decision(accumulate=accumulate, scale=scale)
            return _ACCUMULATE if accumulate else _NOTHING
        released = tuple(sorted(members))
        members.clear()
        return Decision(accumulate=accumulate, update=True, release=released, scale=scale)

    @abstractmethod
    def _decide(self, worker: int, staleness: int) -> Decision: ...

    @abstractmethod
    def _decide_after_leave(self) -> Decision: ...


class BulkSynchronousPolicy(ConsistencyPolicy):
    """BSP (Valiant 1990; synchronous SGD with a parameter server, e.g. Chen et al. 2016).

    Sums the gradients of a round and applies them as one update once every active worker has
    pushed, then releases them all: one weight update per iteration.
    """

    STATE = (*ConsistencyPolicy.STATE, "arrived")

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.arrived: set[int] = set()

    def _decide(self, worker: int, staleness: int) -> Decision:
        self.arrived.add(worker)
        return self._release_if_quorum(self.arrived, self._quorum(), accumulate=True)

    def _decide_after_leave(self) -> Decision:
        return self._release_if_quorum(self.arrived, self._quorum(), accumulate=False)

    def _quorum(self) -> int:
        return len(self.active)


class QuorumSynchronousPolicy(BulkSynchronousPolicy):
    """k-BSP (Dutta et al., "Slow and Stale Gradients Can Win the Race", AISTATS 2018; the
    Strategy-Switch thesis §3.2.2), and backup workers (Chen et al., "Revisiting Distributed
    Synchronous SGD", 2016: N + b workers, the first N gradients count).

    A round closes once `quorum` distinct workers have pushed gradients computed on the current
    parameters; their mean is one update. A straggler's gradient arrives computed on a closed
    round's parameters (staleness > 0): it is dropped (the cancelled work of the paper) and the
    straggler gets the new parameters at once.
    """

    fixed_rounds = True

    def __init__(self, workers: int, quorum: int) -> None:
        super().__init__(workers)
        self.quorum = quorum
        self.survives_lost_worker = quorum < workers

    def _quorum(self) -> int:
        return self.quorum

    def _decide(self, worker: int, staleness: int) -> Decision:
        if staleness > 0:
            return Decision(accumulate=False, release=(worker,))
        return super()._decide(worker, staleness)


class AsynchronousPolicy(ConsistencyPolicy):
    """ASP (Hogwild!, Recht et al. 2011; Downpour SGD, Dean et al. 2012).

    Applies every push at once as its own update and answers only the pusher: N weight updates
    per round, gradients computed on parameters other workers have since changed (staleness).
    """

    combines = False
    survives_lost_worker = True

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.concurrency = float(workers)
        # Each worker's answer, made once (the simulator asks for a million).
        self._answers = [Decision(update=True, release=(w,)) for w in range(workers)]

    def _decide(self, worker: int, staleness: int) -> Decision:
        return self._answers[worker]

    def _decide_after_leave(self) -> Decision:
        return _NOTHING


class QuorumAsynchronousPolicy(ConsistencyPolicy):
    """k-ASP (Dutta et al., AISTATS 2018; the Strategy-Switch thesis §3.2.2): one update once k
    gradients are in, whatever parameters they were computed on. Nobody is cancelled: a straggler's
    gradient counts toward a later update. k = 1 is ASP; k = N releases like BSP.
    """

    STATE = (*ConsistencyPolicy.STATE, "waiting")
    survives_lost_worker = True

    def __init__(self, workers: int, quorum: int) -> None:
        super().__init__(workers)
        self.quorum = quorum
        self.concurrency = workers / quorum
        self.combines = quorum > 1
        self.waiting: set[int] = set()

    def _decide(self, worker: int, staleness: int) -> Decision:
        self.waiting.add(worker)
        return self._release_if_quorum(self.waiting, self.quorum, accumulate=True,
                                       scale=self._scale(staleness))

    def _decide_after_leave(self) -> Decision:
        return self._release_if_quorum(self.waiting, self.quorum, accumulate=False)

    def _scale(self, staleness: int) -> float:
        return 1.0


class SoftSynchronousPolicy(QuorumAsynchronousPolicy):
    """n-softsync with a staleness-aware learning rate (Zhang, Gupta, Lian and Liu,
    "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016), with the floor of
    DynSGD-style rules: each gradient's learning rate is divided by its staleness, never below
    `lr_floor` of the base rate; one update per `quorum` gradients (N/n in the paper).
    """

    def __init__(self, workers: int, quorum: int, lr_floor: float) -> None:
        super().__init__(workers, quorum)
        self.lr_floor = lr_floor

    def _scale(self, staleness: int) -> float:
        return max(self.lr_floor, 1.0 / max(1, staleness))


class StaleSynchronousPolicy(ConsistencyPolicy):
    """SSP (Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NIPS 2013), optionally value-bounded (the VAP model of Bösen: Wei et
    al., "Managed Communication and Consistency for Fast Data-Parallel Iterative Analytics",
    SoCC 2015).

    Applies every push at once, like ASP, but holds a worker back while it is more than
    `staleness` clocks ahead of the slowest active worker. staleness = 0 releases exactly as
    BSP does; a very large staleness never blocks, as ASP.

    With a `value_bound`, pushes are also held (accumulated, not applied, their workers kept
    waiting) while the change some active worker has not yet seen exceeds the bound in
    max-norm (a triangle-inequality bound: the sum of the changes since its last pull). The
    held pushes are applied together once the unseen change is back under the bound, or when
    every active worker is waiting, since no one could then lower it (no deadlock).
    """

    STATE = (*ConsistencyPolicy.STATE, "waiting", "held", "unseen", "_released")
    survives_lost_worker = True  # the bound is on the slowest *active* worker

    def __init__(self, workers: int, staleness: int, value_bound: float | None = None) -> None:
        super().__init__(workers)
        self.concurrency = float(workers)
        self.staleness = staleness
        self.value_bound = value_bound
        self.tracks_change = self.combines = value_bound is not None
        self.waiting: set[int] = set()
        self.held: set[int] = set()  # waiting workers whose gradient is not applied yet
        self.unseen = dict.fromkeys(range(workers), 0.0)  # change since each worker's pull
        self._released: tuple[int, ...] = ()

    def _decide(self, worker: int, staleness: int) -> Decision:
        self.waiting.add(worker)
        self.held.add(worker)
        return self._apply_and_release(accumulate=True)

    def _decide_after_leave(self) -> Decision:
        return self._apply_and_release(accumulate=False)

    def on_update(self, change: float) -> None:
        for w in self.active.difference(self._released):
            self.unseen[w] += change

    def _apply_and_release(self, accumulate: bool) -> Decision:
        update = bool(self.held) and not self._must_hold()
        if update:
            self.held.clear()
        released = self._releasable()
        for w in released:
            self.unseen[w] = 0.0
        self._released = released
        return Decision(accumulate=accumulate, update=update, release=released)

    def _must_hold(self) -> bool:
        if self.value_bound is None or not self.active or self.active <= self.waiting:
            return False
        return max(self.unseen[w] for w in self.active) > self.value_bound

    def _releasable(self) -> tuple[int, ...]:
        ready = self.waiting - self.held
        if self.active:
            slowest = min(self.clocks[w] for w in self.active)
            ready = {w for w in ready if self.clocks[w] - slowest <= self.staleness}
        self.waiting.difference_update(ready)
        return tuple(sorted(ready))
