"""What a strategy is to the rest of polyrhythm: its declaration, registered by name.

A declaration is torch-free: its worker side is named lazily ("package.module:Class"), so
listing strategies or checking a config imports neither torch nor the worker's module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from polyrhythm.settings import Component, Registry, load_object
from polyrhythm.strategies.consistency import ConsistencyPolicy
from polyrhythm.strategies.server_updates import SUM

PARAMETER_SERVER, COLLECTIVE, DECENTRALISED = "parameter server", "collective", "decentralised"
SWITCHING = "switching"  # one strategy, then another (Strategy-Switch)
MAP_REDUCE = "map-reduce"  # Spark jobs driven from one driver (MLlib); no worker side
# Whose gradients one update applies: the mean of every worker's of the step (all-reduce,
# bsp), one worker's (asp, ssp, the averaging strategies' local steps), or a quorum's (k-BSP,
# k-ASP, backup workers, softsync), which no worker knows before the update.
EVERY_WORKERS, ONE_WORKERS, SOME_WORKERS = "every worker's", "one worker's", "some workers'"


def never(settings: Mapping[str, Any]) -> bool:
    return False


def always(settings: Mapping[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class StrategySpec(Component):
    """A registered strategy: its worker side and, for parameter-server strategies, the
    consistency policy of its servers.

    - `worker`: the worker-side class (a `Strategy`) or "package.module:Class"; built as
      `worker(ctx, flat, batch_weight, settings, **worker_args)`.
    - `policy(settings, workers)`: the policy of each server bucket, which decides when
      pushes become an update; None for strategies without servers.
    - `server_update`: what such an update does (strategies/server_updates/: SUM, MEAN,
      ELASTIC, DELAY_COMPENSATED), built with the strategy's settings.
    - `updates_from`: whose gradients one update applies (EVERY_WORKERS, ONE_WORKERS,
      SOME_WORKERS), what a script's job.clip_grad_norm_ clips (None: the worker's own).
    - `whole_gradient(settings)` (the strategy's settings as given, a mapping): its policy
      decides on a worker's whole gradient (quorums, value bounds), so the model travels as
      one bucket to one server. Policies are per bucket and a worker waits for all its
      buckets: quorums decided per bucket could each wait for a worker that another bucket
      holds (deadlock), or apply a gradient on one bucket and drop it on another.
    """

    family: str = PARAMETER_SERVER
    worker: str | Callable[..., Any] = ""
    worker_args: Mapping[str, Any] = field(default_factory=dict)
    policy: Callable[..., ConsistencyPolicy] | None = None
    # What its servers' update does with the pushes its policy gathers (a name of
    # strategies/server_updates/, loaded by the server).
    server_update: str = SUM
    whole_gradient: Callable[[Mapping[str, Any]], bool] = never
    # Whose gradients an update applies (EVERY_WORKERS, ...): what job.clip_grad_norm_ clips.
    # None: the worker side says (a Strategy-Switch's, its phase's).
    updates_from: str | None = ONE_WORKERS
    # Its messages may be compressed ([compression]); else a compressor is refused in one line.
    compressible: bool = True
    # Its workers, which meet only in sums over all of them (all-reduces of gradients or
    # models), in exchanges with their ring neighbours, or in messages to peers that need no
    # answer (gossip), regroup over the workers left when one is lost, and go on
    # (comm/membership.py).
    regroups: bool = False

    @property
    def uses_servers(self) -> bool:
        return self.policy is not None

    def server_updates(self, settings: Any, workers: int) -> Callable[..., Any]:
        """What makes each server bucket's update (a ServerUpdate class of server_updates/,
        loaded now), with the strategy's settings and the worker count given."""
        return partial(load_object(self.server_update), settings=settings, workers=workers)

    def build_worker(self, ctx: Any, flat: Any, batch_weight: float, settings: Any) -> Any:
        """The worker side of this strategy for one worker."""
        worker = load_object(self.worker)(ctx, flat, batch_weight, settings, **self.worker_args)
        if self.updates_from is not None:
            worker.updates_from = self.updates_from
        return worker


STRATEGIES: Registry[StrategySpec] = Registry("strategy")
