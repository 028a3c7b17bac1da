"""The worker-side Strategy seam and the registry of strategies by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.context import RankContext
from polyrhythm.flat import FlatParameters
from polyrhythm.strategies.consistency import ConsistencyPolicy


class Strategy(ABC):
    """How a worker turns its local gradient into new parameters.

    The worker loop calls `step` after every backward pass, with the gradients in the model;
    when it returns, the model holds the parameters for the next step. `batch_weight` is the
    worker's share of the global batch (b_i / B), so weighted gradients sum to the global mean.
    """

    def __init__(self, ctx: RankContext, flat: FlatParameters, batch_weight: float) -> None:
        self.ctx = ctx
        self.flat = flat
        self.batch_weight = batch_weight

    def begin_step(self, epoch: int) -> None:  # noqa: B027 - optional hook
        """Called before each forward pass (set-up for communication during backward)."""

    @abstractmethod
    def step(self, epoch: int) -> None:
        """Communicate this step's gradient and leave the next parameters in the model."""

    def finish(self) -> None:  # noqa: B027 - optional hook, most strategies need nothing
        """Called once after the last step."""

    @property
    def stopped(self) -> bool:
        """The job ended training before this worker's last step (k-BSP's servers end it
        once the run's rounds are done): the worker takes no more steps."""
        return False

    def consensus_weight(self) -> float | None:
        """Where workers hold different models: this worker's weight in their consensus (the
        model validated at epoch ends is the weighted mean). None: worker 0's model is it."""
        return None


def no_defaults(config) -> dict:
    return {}


def never(settings) -> bool:
    return False


def always(settings) -> bool:
    return True


@dataclass(frozen=True)
class StrategySpec:
    """A registered strategy: its worker side and, for PS strategies, its server policy.

    `parameters` are the RunConfig fields it reads (others' parameters are errors for it);
    `defaults(config)` resolves those left unset whose default depends on the run (e.g. N).
    `whole_gradient(settings)` (the fields set for the run, a mapping): its policy decides on a
    worker's whole gradient (quorums, value bounds), so the model travels as one bucket to one
    server. Policies are per bucket, and a worker waits for all its buckets: quorums decided
    per bucket could each wait for a worker that another bucket holds (deadlock), or apply a
    gradient on one bucket and drop it on another. BSP, ASP and SSP decide per bucket safely.
    """

    name: str
    summary: str
    worker: Callable[..., Strategy]
    policy: Callable[..., ConsistencyPolicy] | None = None
    parameters: tuple[str, ...] = ()
    defaults: Callable[..., dict] = no_defaults
    whole_gradient: Callable[..., bool] = never

    @property
    def uses_servers(self) -> bool:
        return self.policy is not None
