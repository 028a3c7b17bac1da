"""The parameter-server strategies: a consistency policy on the servers (consistency.py)
decides when a push becomes a weight update and when a waiting worker may go on, and a server
update (server_updates/) what the update does; the worker side pushes gradients and pulls
parameters on its cadence (strategies/ps_worker.py), or, for EASGD, exchanges elastic differences
(strategies/easgd.py).
"""

from __future__ import annotations

from polyrhythm.limits import MAX_FACTOR, MAX_PERIOD
from polyrhythm.settings import Param, Rule, at_least, positive, within
from polyrhythm.strategies.consistency import (
    AsynchronousPolicy,
    BulkSynchronousPolicy,
    QuorumAsynchronousPolicy,
    QuorumSynchronousPolicy,
    SoftSynchronousPolicy,
    StaleSynchronousPolicy,
)
from polyrhythm.strategies.server_updates import DELAY_COMPENSATED, ELASTIC, MEAN
from polyrhythm.strategies.spec import EVERY_WORKERS, SOME_WORKERS, StrategySpec, always

PS_WORKER = "polyrhythm.strategies.ps_worker:ParameterServerWorker"


def _quorum(default: str, derive) -> Param:
    return Param("quorum", int, "gradients per update, 1 <= k <= N", derive=derive,
                 derived=default, rule=Rule(lambda k, run: 1 <= k <= run.workers,
                                            lambda run: "be between 1 and the worker count "
                                                        f"{run.workers}"))


BSP = StrategySpec(
    "bsp", "synchronous parameter server: one update per round of N pushes",
    source="bulk synchronous parallel", worker=PS_WORKER, updates_from=EVERY_WORKERS,
    policy=lambda s, n: BulkSynchronousPolicy(n))

ASP = StrategySpec(
    "asp", "asynchronous parameter server: every push is applied at once",
    source="Hogwild!, Downpour SGD",
    worker=PS_WORKER, policy=lambda s, n: AsynchronousPolicy(n))

SSP = StrategySpec(
    "ssp", "stale-synchronous parameter server: at most s clocks ahead, optionally a value "
    "bound",
    source="Ho et al., NIPS 2013; after Bösen's value-bounded model, Wei et al., SoCC 2015",
    worker=PS_WORKER, params=(
        Param("staleness", int, "clocks a worker may run ahead of the slowest", 3,
              rule=at_least(0)),
        Param("value_bound", float, "hold pushes while the applied change some worker has "
              "not pulled yet exceeds this in max-norm", rule=positive(), metavar="X")),
    policy=lambda s, n: StaleSynchronousPolicy(n, s.staleness, s.value_bound),
    whole_gradient=lambda s: s.get("value_bound") is not None)

KBSP = StrategySpec(
    "kbsp", "k-BSP: one update from the first k workers of a round, the late gradients "
    "dropped", source="k-BSP, Dutta et al., AISTATS 2018", worker=PS_WORKER,
    params=(_quorum("N-1", lambda run: max(1, run.workers - 1)),),
    policy=lambda s, n: QuorumSynchronousPolicy(n, s.quorum), whole_gradient=always,
    updates_from=SOME_WORKERS, server_update=MEAN)

KASP = StrategySpec(
    "kasp", "k-ASP: one update per k gradients, late ones count toward the next",
    source="k-ASP, Dutta et al., AISTATS 2018", worker=PS_WORKER,
    params=(_quorum("N/2", lambda run: max(1, run.workers // 2)),),
    policy=lambda s, n: QuorumAsynchronousPolicy(n, s.quorum), whole_gradient=always,
    updates_from=SOME_WORKERS)

BACKUP = StrategySpec(
    "backup", "backup workers: of N workers, the first N-b gradients of a round count",
    source="backup workers, Chen et al. 2016", worker=PS_WORKER, params=(
        Param("backup", int, "spare workers b; the first N-b gradients of a round count", 1,
              rule=Rule(lambda b, run: 1 <= b < run.workers,
                        lambda run: f"be at least 1 and below the worker count {run.workers}")),
    ),
    policy=lambda s, n: QuorumSynchronousPolicy(n, n - s.backup), whole_gradient=always,
    updates_from=SOME_WORKERS, server_update=MEAN)

SOFTSYNC = StrategySpec(
    "softsync", "staleness-aware async: each gradient's lr divided by its staleness, with a "
    "floor", source="n-softsync, Zhang et al., IJCAI 2016", worker=PS_WORKER, params=(
        _quorum("1", lambda run: 1),
        Param("lr_floor", float, "smallest share of the learning rate a stale gradient keeps",
              0.1, rule=within(0, 1, low_open=True))),
    policy=lambda s, n: SoftSynchronousPolicy(n, s.quorum, s.lr_floor), whole_gradient=always,
    updates_from=SOME_WORKERS, server_update=MEAN)

DOWNPOUR = StrategySpec(
    "downpour", "Downpour SGD: async PS, push every n_push and fetch every n_fetch steps",
    source="Dean et al., NIPS 2012", worker=PS_WORKER, params=(
        Param("push_every", int, "push the accumulated gradient every this many steps", 1,
              rule=at_least(1, MAX_PERIOD)),
        Param("fetch_every", int, "fetch the parameters every this many steps", 1,
              rule=at_least(1, MAX_PERIOD))),
    policy=lambda s, n: AsynchronousPolicy(n))

DCASGD = StrategySpec(
    "dcasgd", "delay-compensated async: each stale gradient g corrected by "
    "λ·g⊙g⊙(w − w_pulled) before its step", source="DC-ASGD, Zheng et al., ICML 2017",
    worker=PS_WORKER, params=(
        Param("dc_lambda", float, "variance control λ of the compensation (0: asp)", 0.04,
              rule=at_least(0, MAX_FACTOR), metavar="λ"),),
    policy=lambda s, n: AsynchronousPolicy(n), server_update=DELAY_COMPENSATED)

TAU = Param("tau", int, "local steps between synchronisations", 4, rule=at_least(1))
ALPHA = Param("alpha", float, "elastic moving rate", derive=lambda run: 0.9 / run.workers,
              derived="0.9/N", rule=within(0, 1, low_open=True))

EASGD = StrategySpec(
    "easgd", "elastic averaging: workers pulled toward a centre on the servers every tau "
    "steps", source="asynchronous EASGD, Zhang, Choromanska and LeCun, NIPS 2015",
    worker="polyrhythm.strategies.easgd:ElasticAveragingWorker", params=(
        TAU, ALPHA),
    policy=lambda s, n: AsynchronousPolicy(n), server_update=ELASTIC)
