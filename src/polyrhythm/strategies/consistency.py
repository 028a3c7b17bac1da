"""Server-side consistency policies: pure logic, no I/O, tested without processes.

The server loop (server.py) is written once. For every push it asks its policy a `Decision`:
whether to add the gradient to the pending update, whether to apply the pending update now,
and which waiting workers to answer with the current parameters. Workers are numbered 0..N-1;
a worker's clock is the number of pushes it has made.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """What the server does after a push (or after a worker leaves)."""

    accumulate: bool = True  # add this push's weighted gradient to the pending update
    update: bool = False  # apply the pending update as one optimizer step
    release: tuple[int, ...] = ()  # workers to answer now with the current parameters


class ConsistencyPolicy(ABC):
    """Decides when pushes become weight updates and when blocked workers may go on."""

    asynchronous = False  # applies gradients computed on parameters that others changed since

    def __init__(self, workers: int) -> None:
        self.active = set(range(workers))
        self.clocks = dict.fromkeys(range(workers), 0)

    def on_push(self, worker: int, clock: int) -> Decision:
        """Worker `worker` pushed its gradient number `clock` (1-based) and now waits."""
        self.clocks[worker] = clock
        return self._decide(worker)

    def on_done(self, worker: int) -> Decision:
        """Worker `worker` finished training; it waits for nothing and holds nobody back."""
        self.active.discard(worker)
        return self._decide_after_leave()

    @abstractmethod
    def _decide(self, worker: int) -> Decision: ...

    @abstractmethod
    def _decide_after_leave(self) -> Decision: ...


class BulkSynchronousPolicy(ConsistencyPolicy):
    """BSP (Valiant 1990; synchronous SGD with a parameter server, e.g. Chen et al. 2016).

    Sums the gradients of a round and applies them as one update once every active worker has
    pushed, then releases them all: one weight update per iteration.
    """

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.arrived: set[int] = set()

    def _decide(self, worker: int) -> Decision:
        self.arrived.add(worker)
        return self._close_round_if_complete(accumulate=True)

    def _decide_after_leave(self) -> Decision:
        return self._close_round_if_complete(accumulate=False)

    def _close_round_if_complete(self, accumulate: bool) -> Decision:
        if not self.arrived or not self.active <= self.arrived:
            return Decision(accumulate=accumulate)
        released = tuple(sorted(self.arrived))
        self.arrived.clear()
        return Decision(accumulate=accumulate, update=True, release=released)


class AsynchronousPolicy(ConsistencyPolicy):
    """ASP (Hogwild!, Recht et al. 2011; Downpour SGD, Dean et al. 2012).

    Applies every push at once as its own update and answers only the pusher: N weight updates
    per round, gradients computed on parameters other workers have since changed (staleness).
    """

    asynchronous = True

    def _decide(self, worker: int) -> Decision:
        return Decision(update=True, release=(worker,))

    def _decide_after_leave(self) -> Decision:
        return Decision(accumulate=False)


class StaleSynchronousPolicy(ConsistencyPolicy):
    """SSP (Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NIPS 2013).

    Applies every push at once, like ASP, but holds a worker back while it is more than
    `staleness` clocks ahead of the slowest active worker. staleness = 0 releases exactly as
    BSP does; a very large staleness never blocks, as ASP.
    """

    asynchronous = True

    def __init__(self, workers: int, staleness: int) -> None:
        super().__init__(workers)
        self.staleness = staleness
        self.waiting: set[int] = set()

    def _decide(self, worker: int) -> Decision:
        self.waiting.add(worker)
        return Decision(update=True, release=self._releasable())

    def _decide_after_leave(self) -> Decision:
        return Decision(accumulate=False, release=self._releasable())

    def _releasable(self) -> tuple[int, ...]:
        if not self.active:
            released = tuple(sorted(self.waiting))
        else:
            slowest = min(self.clocks[w] for w in self.active)
            released = tuple(sorted(w for w in self.waiting
                                    if self.clocks[w] - slowest <= self.staleness))
        self.waiting.difference_update(released)
        return released
