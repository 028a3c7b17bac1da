"""Every training strategy, by name. A new algorithm is one class and one line here."""

from polyrhythm.strategies.allreduce import AllReduceWorker
from polyrhythm.strategies.base import Strategy, StrategySpec
from polyrhythm.strategies.consistency import (
    AsynchronousPolicy,
    BulkSynchronousPolicy,
    StaleSynchronousPolicy,
)
from polyrhythm.strategies.ps import ParameterServerWorker

_SPECS = [
    StrategySpec("bsp", "synchronous parameter server: one update per round of N pushes",
                 ParameterServerWorker, lambda c: BulkSynchronousPolicy(c.workers)),
    StrategySpec("asp", "asynchronous parameter server: every push is applied at once",
                 ParameterServerWorker, lambda c: AsynchronousPolicy(c.workers)),
    StrategySpec("ssp", "stale-synchronous parameter server: at most s clocks ahead",
                 ParameterServerWorker,
                 lambda c: StaleSynchronousPolicy(c.workers, c.staleness), ("staleness",)),
    StrategySpec("allreduce", "synchronous all-reduce (Gloo) with an optimizer copy per worker",
                 AllReduceWorker),
]

STRATEGIES: dict[str, StrategySpec] = {s.name: s for s in _SPECS}

__all__ = ["STRATEGIES", "Strategy", "StrategySpec"]
