"""The worker-side Strategy seam: how a worker turns its gradient into new parameters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.context import RankContext
from polyrhythm.flat import FlatParameters
from polyrhythm.optim import Updater, updater
from polyrhythm.settings import Settings


@dataclass
class EpochEnd:
    """What a worker knows when an epoch of its ends: how many epochs are done, its seconds
    waiting for peers or servers and its seconds of training iterations in that epoch, and
    `validate()`, which validates the model now (every worker must call it together) and
    returns its val_loss (and val_accuracy, where the run's loss classifies)."""

    epochs_done: int
    wait_s: float
    iteration_s: float
    validate: Callable[[], dict[str, float]]


class Strategy(ABC):
    """How a worker turns its local gradient into new parameters.

    The worker loop calls `step` after every backward pass, with the gradients in the model;
    when it returns, the model holds the parameters for the next step. `batch_weight` is the
    worker's share of the global batch (b_i / B), so weighted gradients sum to the global mean.
    `settings` are the strategy's own (its declared parameters). A strategy talks to servers
    and peers only through `ctx.transport`. Where the run is a user's script, `rates` and
    `hyper` are its optimizer's settings now (its scheduler's), which a worker's own steps
    and its pushes follow; None where the run's [optimizer] schedule is followed.
    """

    # Where the run is a user's script: each parameter's rate now (its param group's lr, its
    # scheduler's), in flat order; None where the run's [optimizer] schedule is followed.
    rates: list[float] | None = None
    # Steps each worker's replica with plain SGD between exchanges (Downpour between
    # fetches): a script's optimizer must then be SGD, whose groups' rates it follows.
    local_sgd = False
    # A script's optimizer's settings now (runtime/worker/user_optimizer.py Hyperparameters.values),
    # which pushes carry to servers; None where none ride.
    hyper: list[float] | None = None
    # Whose gradients one update applies (strategies/spec.py EVERY_WORKERS, ...), as the
    # strategy's declaration says (set by StrategySpec.build_worker).
    updates_from: str | None = None

    def __init__(self, ctx: RankContext, flat: FlatParameters, batch_weight: float,
                 settings: Settings) -> None:
        self.ctx = ctx
        self.flat = flat
        self.batch_weight = batch_weight
        self.settings = settings

    def local_optimizer(self) -> Updater:
        """The optimizer this worker steps itself: the run's [optimizer], or in a user's
        script its own (which keeps its own rates: its scheduler's)."""
        return self.ctx.user_optimizer or updater(self.flat.data, self.ctx.config.optimizer)

    def start(self) -> None:  # noqa: B027 - optional hook
        """Called once before the first step: begin receiving (building does no I/O)."""

    def begin_step(self, epoch: int) -> None:  # noqa: B027 - optional hook
        """Called before each forward pass (set-up for communication during backward)."""

    def gradients_ready(self) -> None:  # noqa: B027 - most strategies read them in step
        """Called in a user's script, between begin_step and step, once the step's
        gradients are in the model: where backward's hooks would have sent them, send them
        now (the user may have clipped or accumulated them since)."""

    def reduce_gradients(self) -> None:
        """Where every update applies every worker's gradient (updates_from): make the
        gradients in the model this step's mean of all workers', now, so that a script can
        clip them as one process clips its own (job.clip_grad_norm_); the step then sends
        them as they are. Every worker calls it at the same step."""
        raise NotImplementedError(f"{type(self).__name__} has no mean gradient before a step")

    @property
    def workers_agree(self) -> bool:
        """Every worker steps the same gradient with a copy of the same optimizer, so all
        hold the same parameters after each step (the all-reduce family): a difference is a
        worker's own doing, checked at epoch ends (runtime/worker/engine.py)."""
        return False

    @abstractmethod
    def step(self, epoch: int) -> None:
        """Communicate this step's gradient and leave the next parameters in the model."""

    def end_epoch(self, end: EpochEnd) -> dict:
        """Called by every worker after each epoch; returns fields for the epoch's record
        (a val_loss among them means the epoch is validated already)."""
        return {}

    def finish(self) -> None:  # noqa: B027 - optional hook, most strategies need nothing
        """Called once after the last step."""

    def summary(self) -> dict:
        """Figures this strategy adds to the run's summary (worker 0's)."""
        return {}

    @property
    def servers_hold_model(self) -> bool:
        """Whether a checkpoint needs the servers' state now: where they count the model's
        progress (parameter-server strategies), and a Strategy-Switch's once it switched."""
        return self.progress is not None

    @property
    def stopped(self) -> bool:
        """The job ended training before this worker's last step (k-BSP's servers end it
        once the run's rounds are done): the worker takes no more steps."""
        return False

    @property
    def progress(self) -> float | None:
        """Global batches' worth of gradient the model has received, as this worker last
        heard (shared epochs end on it); None where the strategy does not count them."""
        return None

    def consensus_weight(self) -> float | None:
        """Where workers hold different models: this worker's weight in their consensus (the
        model validated at epoch ends is the weighted mean). None: worker 0's model is it."""
        return None

    def state_dict(self) -> dict:
        """What this worker's side of the strategy holds beyond the model's own parameters
        (optimizer state, accumulated gradients, cadence, weights), as tensors and plain
        values."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - stateless by default
        """Restore what `state_dict` returned."""
