"""Every training strategy, by name. A new algorithm is one class and one entry here."""

import functools

from polyrhythm.strategies.allreduce import AllReduceWorker
from polyrhythm.strategies.base import Strategy, StrategySpec, always
from polyrhythm.strategies.consistency import (
    AsynchronousPolicy,
    BulkSynchronousPolicy,
    ElasticAveragingPolicy,
    QuorumAsynchronousPolicy,
    QuorumSynchronousPolicy,
    SoftSynchronousPolicy,
    StaleSynchronousPolicy,
)
from polyrhythm.strategies.decentralised import (
    GossipWorker,
    LocalSGDWorker,
    RingExchangeWorker,
)
from polyrhythm.strategies.easgd import ElasticAveragingWorker
from polyrhythm.strategies.ps import ParameterServerWorker

PS = ParameterServerWorker

_PARAMETER_SERVER = [
    StrategySpec("bsp", "synchronous parameter server: one update per round of N pushes",
                 PS, lambda c: BulkSynchronousPolicy(c.workers)),
    StrategySpec("asp", "asynchronous parameter server: every push is applied at once",
                 PS, lambda c: AsynchronousPolicy(c.workers)),
    StrategySpec("ssp", "stale-synchronous parameter server: at most s clocks ahead, "
                 "optionally a value bound", PS,
                 lambda c: StaleSynchronousPolicy(c.workers, c.staleness, c.value_bound),
                 ("staleness", "value_bound"),
                 whole_gradient=lambda s: s.get("value_bound") is not None),
    StrategySpec("kbsp", "k-BSP: one update from the first k workers of a round, the late "
                 "gradients dropped", PS,
                 lambda c: QuorumSynchronousPolicy(c.workers, c.quorum), ("quorum",),
                 lambda c: {"quorum": max(1, c.workers - 1)}, always),
    StrategySpec("kasp", "k-ASP: one update per k gradients, late ones count toward the next",
                 PS, lambda c: QuorumAsynchronousPolicy(c.workers, c.quorum), ("quorum",),
                 lambda c: {"quorum": max(1, c.workers // 2)}, always),
    StrategySpec("backup", "backup workers: of N workers, the first N-b gradients of a round "
                 "count",
                 PS, lambda c: QuorumSynchronousPolicy(c.workers, c.workers - c.backup),
                 ("backup",), whole_gradient=always),
    StrategySpec("softsync", "staleness-aware async: each gradient's lr divided by its "
                 "staleness, with a floor", PS,
                 lambda c: SoftSynchronousPolicy(c.workers, c.quorum, c.lr_floor),
                 ("quorum", "lr_floor"), lambda c: {"quorum": 1}, always),
    StrategySpec("downpour", "Downpour SGD: async PS, push every n_push and fetch every "
                 "n_fetch steps", PS, lambda c: AsynchronousPolicy(c.workers),
                 ("push_every", "fetch_every")),
    StrategySpec("easgd", "elastic averaging: workers pulled toward a centre on the servers "
                 "every tau steps", ElasticAveragingWorker,
                 lambda c: ElasticAveragingPolicy(c.workers), ("tau", "alpha"),
                 lambda c: {"alpha": 0.9 / c.workers}),
]

_COLLECTIVE = [
    StrategySpec("allreduce", "synchronous all-reduce (Gloo) with an optimizer copy per worker",
                 AllReduceWorker),
    StrategySpec("ring", "synchronous all-reduce as a ring over point-to-point messages "
                 "(reduce-scatter + all-gather)",
                 functools.partial(AllReduceWorker, algorithm="ring")),
    StrategySpec("reduce-broadcast", "synchronous all-reduce through worker 0, which sums "
                 "every gradient and sends the sum back",
                 functools.partial(AllReduceWorker, algorithm="reduce-broadcast")),
    StrategySpec("tree", "synchronous all-reduce as a binomial-tree reduce and broadcast",
                 functools.partial(AllReduceWorker, algorithm="tree")),
]

_DECENTRALISED: list[StrategySpec] = [
    StrategySpec("localsgd", "local SGD: tau local steps, then the models are averaged "
                 "(batch-weighted all-reduce)", LocalSGDWorker, parameters=("tau",)),
    StrategySpec("dpsgd", "D-PSGD: every step each worker averages its model with its ring "
                 "neighbours'", RingExchangeWorker),
    StrategySpec("gossip", "GoSGD: after a step, with probability p, send the model and half "
                 "its weight to a random peer", GossipWorker, parameters=("gossip_p",)),
]

STRATEGIES: dict[str, StrategySpec] = {
    s.name: s for s in _PARAMETER_SERVER + _COLLECTIVE + _DECENTRALISED}

__all__ = ["STRATEGIES", "Strategy", "StrategySpec"]
