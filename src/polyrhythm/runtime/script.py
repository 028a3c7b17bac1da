"""A user's training script as a polyrhythm worker: `Job` (what `polyrhythm.init()` returns on
a worker) wraps the script's model and optimizer so that `opt.step()` makes the strategy's
exchange, hands out this worker's shard of the data, counts its steps and epochs, and keeps
what the script logs. What joins the job and what happens on server ranks is launch/script.py's.

The script's loop stays the script's: its forward, its loss, its backward, gradient clipping
or accumulation, its scheduler. At `opt.step()` the gradients in the model are this worker's
(after whatever the script did to them); the strategy sends them or all-reduces them, and the
model holds the next parameters when the call returns. Where the workers step an optimizer
themselves (all-reduce, local SGD, ...), it is the script's; where servers do, they rebuild
it on their slices (runtime/optimizers.py) and step at the rate each push carries: the
script's group 0 rate as its scheduler left it (the other groups keep their ratio to it).
"""

from __future__ import annotations

import math
import time
import types
import weakref
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from polyrhythm.context import RankContext
from polyrhythm.errors import ConfigError, Diverged
from polyrhythm.flat import FlatParameters
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.runtime.optimizers import UserOptimizer, optimizer_spec, rates
from polyrhythm.runtime.script_data import ShardSampler, shard_loader
from polyrhythm.runtime.worker import worker_report
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.base import EpochEnd

_ACTIVE: list[Job] = []  # the job whose optimizer steps now (one per process)


class Job:
    """One worker's side of a job run from a user's script. `ctx` None: a plain
    `python script.py`, one worker and nothing to exchange (the script runs as it would
    without polyrhythm; nothing is recorded)."""

    def __init__(self, ctx: RankContext | None, describe_servers=None, finish=None) -> None:
        """`describe_servers(job)` tells the servers what they serve (at the first step);
        `finish(job)` hands in the report and leaves the job (launch/script.py)."""
        self.ctx = ctx
        self._finish = finish
        self.workers = ctx.config.workers if ctx else 1
        self.worker = ctx.worker_index if ctx else 0
        self._describe_servers = describe_servers  # sends the servers what they serve
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.flat: FlatParameters | None = None
        self.strategy = None
        self.epochs_done: list[dict] = []  # the records of the epochs done
        self.iterations: list[tuple] = []
        self.steps_per_epoch: int | None = None  # known once a loader or sampler is made
        self.total_epochs: int | None = None  # known once epochs(n) is called
        self.batch_size = 0  # examples a step, known once a loader is made (for records)
        self.servers_spec = None  # the optimizer the servers rebuild (runtime/optimizers.py)
        self.ended_pass = False  # a loader pass ended the epoch, which ends at the next
        self._logged: dict[str, float] = {}
        self._samplers: weakref.WeakSet[ShardSampler] = weakref.WeakSet()
        self._losses: list[torch.Tensor] = []  # this step's backward losses
        self._rates: list[float] = []
        self._epoch, self._taken, self._first_step = 0, 0, True
        self._reset_epoch()

    # -- the script's calls ------------------------------------------------------------

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and optimizer as this job trains them (the same objects): from now on
        `optimizer.step()` makes the strategy's exchange. Every worker must build the same
        initial model (seed it): one line says which does not."""
        if self.model is not None or getattr(optimizer, "_polyrhythm_job", None) is not None:
            raise ConfigError("job.wrap was called twice: wrap the model and optimizer once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"job.wrap takes a torch.optim optimizer, not "
                              f"{type(optimizer).__name__}")
        self.model, self.optimizer = model, optimizer
        if self.ctx is None:
            return model, optimizer
        self.flat = FlatParameters(model)
        self._check_same_start()
        ctx, config = self.ctx, self.ctx.config
        self._rates = rates(optimizer)
        spec = STRATEGIES[config.strategy.name]
        servers = ctx.topology.servers > 0
        description = None
        if servers:  # before anything else can fail on one worker only
            description = optimizer_spec(optimizer, self.flat, config.strategy.name)
        ctx.user_optimizer = UserOptimizer(optimizer, self.flat)
        # Every worker's batch is the same size (the loader's): each weighs 1/N of the mean.
        self.strategy = spec.build_worker(ctx, self.flat, 1.0 / self.workers, config.strategy)
        self.servers_spec = description
        optimizer._polyrhythm_job = self
        optimizer.step = types.MethodType(_wrapped_step, optimizer)
        _ACTIVE[:] = [self]
        return model, optimizer

    def epochs(self, n: int) -> Iterator[int]:
        """The epochs to train, from the first not done (a resumed run's); each ends when
        the script moves on to the next."""
        self.total_epochs = n
        for epoch in range(len(self.epochs_done), n):
            self._begin_epoch(epoch)
            yield epoch
            self._end_epoch()

    def _begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        for sampler in self._samplers:  # those the script keeps from epoch to epoch
            sampler.epoch = epoch

    def sampler(self, dataset, shuffle: bool = True, seed: int = 0) -> ShardSampler:
        """A sampler of this worker's shard of `dataset` for the script's own DataLoader
        (torch.utils.data.DataLoader(dataset, batch_size, sampler=job.sampler(dataset)))."""
        seed = self.ctx.config.seed if self.ctx else seed
        sampler = ShardSampler(len(dataset), self.worker, self.workers, shuffle, seed)
        sampler.epoch = self._epoch  # made anew each epoch, it still shuffles for the epoch
        self._samplers.add(sampler)
        return sampler

    def loader(self, dataset, batch_size: int, shuffle: bool = True, **kwargs) -> Iterable:
        """This worker's batches of its shard of `dataset` (`batch_size` per worker, as in
        DDP), reshuffled each epoch: a torch DataLoader over `sampler`."""
        loader = shard_loader(self.sampler(dataset, shuffle), dataset, batch_size, **kwargs)
        self.steps_per_epoch, self.batch_size = len(loader), batch_size
        return EpochOfBatches(self, loader)

    def log(self, **metrics: float) -> None:
        """Figures of the epoch now (val_loss, val_accuracy, anything): stored with it; a
        Strategy-Switch rule reads val_loss."""
        for name, value in metrics.items():
            value = float(value.item() if isinstance(value, torch.Tensor) else value)
            self._logged[name] = value

    def finish(self) -> None:
        """The script is done: the run is recorded (rank 0) and this process leaves the job."""
        self._close_pass()
        if self._finish is not None:
            self._finish(self)

    def report(self, lost: set[int]) -> dict:
        """This worker's report (as runtime/worker.py's Worker gives it), with what rank 0
        needs to write the final model: worker 0's model state and its parameters' names in
        flat order (the servers' shards, or its own flat model, fill them in)."""
        ctx = self.ctx
        report = worker_report(ctx, self.epochs_done, self._taken, self.iterations,
                               self.strategy)
        first = min(set(range(self.workers)) - lost)
        if self.worker == first:
            trained = {id(p) for p in self.flat.params}
            report["model"] = {k: v.clone() for k, v in self.model.state_dict().items()}
            report["trained"] = [name for name, p in self.model.named_parameters()
                                 if id(p) in trained]
            if not ctx.topology.servers:
                report["shard"] = (0, len(self.flat), self.flat.data.clone())
        return report

    # -- the optimizer's step ----------------------------------------------------------

    def step(self) -> None:
        """The script's `optimizer.step()`: this worker's gradients through the strategy."""
        began = time.perf_counter()
        loss = self._step_loss()
        if self.ctx is None:
            type(self.optimizer).step(self.optimizer)
        else:
            self._exchange(began, loss)
        self._taken += 1
        self._steps += 1
        if loss is not None:
            self._loss_sum, self._loss_steps = self._loss_sum + loss, self._loss_steps + 1

    def _exchange(self, began: float, loss: float | None) -> None:
        ctx = self.ctx
        if self.strategy.stopped:
            return
        if loss is not None and not math.isfinite(loss):  # before its gradient reaches anyone
            raise Diverged(f"diverged at epoch {self._epoch + 1}, step {self._steps + 1}: "
                           f"training loss {loss}")
        if self._first_step:
            self._start()
        computed = began - self._last  # the script's forward and backward since the last step
        ctx.spans.totals["compute"] += computed
        self.strategy.rate = self._rate()
        self.strategy.begin_step(self._epoch)
        self.strategy.gradients_ready()
        self.strategy.step(self._epoch)
        ended = self._last = time.perf_counter()
        spans = ctx.spans.take()
        self._waited += spans.get("wait", 0.0)
        if ctx.config.instrumentation:
            spans["compute"] = computed
            self.iterations.append((self.worker, self._taken, self._epoch, began - ctx.started,
                                    *(spans.get(name, 0.0) for name in SPAN_NAMES),
                                    ended - began))

    def _start(self) -> None:
        """The first step: the servers learn what they serve, and the clock starts."""
        self._first_step = False
        if self._describe_servers is not None:
            self._describe_servers(self)
        self.strategy.start()
        self.ctx.transport.barrier()
        self.ctx.started = self._last = self._epoch_began = time.perf_counter()

    def _rate(self) -> float:
        """Group 0's rate now; one line if a group's rate left its ratio to it (servers
        step every group at the rate a push carries times its ratio)."""
        now = rates(self.optimizer)
        if self.ctx.topology.servers and len(now) > 1 and now[0]:
            first, then = self._rates[0], self._rates
            if any(abs(r / now[0] - t / first) > 1e-9 * (t / first) for r, t in
                   zip(now[1:], then[1:], strict=True)):
                raise ConfigError("the param groups' learning rates changed out of proportion "
                                  "(each group's must stay the same multiple of group 0's: "
                                  "servers step every group at one scheduled rate)")
        return now[0]

    def _step_loss(self) -> float | None:
        """The sum of the losses backward ran on since the last step (a script that
        accumulates gradients over k batches divides each loss by k: the sum is the mean)."""
        if not self._losses:
            return None
        loss = float(torch.stack([x.float() for x in self._losses]).sum())
        self._losses.clear()
        return loss

    # -- epochs ------------------------------------------------------------------------

    def _reset_epoch(self) -> None:
        self._steps, self._loss_sum, self._loss_steps, self._waited = 0, 0.0, 0, 0.0
        self._epoch_began = self._last = time.perf_counter()
        self._logged = {}

    def _close_pass(self) -> bool:
        """End the epoch a loader pass ended, if one did (EpochOfBatches)."""
        if not self.ended_pass:
            return False
        self.ended_pass = False
        self._end_epoch()
        return True

    def _end_epoch(self) -> None:
        ended = time.perf_counter()
        seconds = ended - self._epoch_began
        record = {"epoch": self._epoch,
                  "train_loss": self._loss_sum / self._loss_steps if self._loss_steps
                  else math.nan,
                  "samples": self._steps * self.batch_size, "seconds": seconds,
                  "wall_s": ended - (self.ctx.started if self.ctx else self._epoch_began),
                  "measured_samples": self._steps * self.batch_size,
                  "measured_seconds": seconds}
        if self.ctx is not None and self.strategy is not None:
            if self.flat is not None and not torch.isfinite(self.flat.data).all():
                raise Diverged(f"diverged at epoch {self._epoch + 1}: non-finite parameters")
            logged = dict(self._logged)
            record |= self.strategy.end_epoch(EpochEnd(self._epoch + 1, self._waited,
                                                       seconds, lambda: logged))
        record |= self._logged
        self.epochs_done.append(record)
        self._reset_epoch()

    def _check_same_start(self) -> None:
        """Every worker's initial parameters are worker 0's (one line naming the first that
        differs): a digest each, gathered, compared exactly."""
        weights = torch.rand(len(self.flat), generator=torch.Generator().manual_seed(7),
                             dtype=torch.float64)
        digest = torch.stack([(self.flat.data.double() * weights).sum(),
                              self.flat.data.double().abs().sum()])
        rows = self.ctx.transport.rows_of_members(digest)
        differ = [w for w in range(1, len(rows)) if not torch.equal(rows[w], rows[0])]
        if differ:
            raise ConfigError(f"worker {differ[0]}'s initial parameters differ from worker "
                              "0's: build the model the same way on every worker (call "
                              "torch.manual_seed with the same seed before building it)")


class EpochOfBatches:
    """A worker's DataLoader over its shard. Where the script does not count its epochs
    with job.epochs, going through it once is an epoch: it ends when the next pass begins
    (or the job finishes), so what the script logs after a pass is that epoch's."""

    def __init__(self, job: Job, loader: torch.utils.data.DataLoader) -> None:
        self.job, self.loader = job, loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        job = self.job
        if job._close_pass():  # what the script logged after the last pass is that epoch's
            job._begin_epoch(job._epoch + 1)
        yield from self.loader
        job.ended_pass = job.total_epochs is None


def _wrapped_step(optimizer: torch.optim.Optimizer, closure=None) -> None:
    """What a wrapped optimizer's step does (bound to it)."""
    if closure is not None:
        raise ConfigError("a wrapped optimizer's step takes no closure (LBFGS-style "
                          "optimizers re-evaluate the loss, which no strategy can share)")
    optimizer._opt_called = True  # what a scheduler's own wrapper of step would mark
    optimizer._polyrhythm_job.step()


# It marks _opt_called itself, as a scheduler's wrapper of step would: so a scheduler made
# before or after wrap sees a step it can track (torch's lr_scheduler reads this attribute).
_wrapped_step._wrapped_by_lr_sched = True


def stepping_unwrapped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """A global optimizer pre-step hook in a job: an optimizer stepped that is neither the
    job's wrapped one (stepping through its class) nor one of the servers' own is one line."""
    if getattr(optimizer, "_polyrhythm_job", None) is not None or getattr(
            optimizer, "polyrhythm_internal", False):
        return
    raise ConfigError(f"an optimizer ({type(optimizer).__name__}) was stepped without "
                      "job.wrap: in a polyrhythm job write model, opt = job.wrap(model, opt) "
                      "and step that")


def recording_backward(original):
    """Tensor.backward that also keeps the loss it ran on (a scalar), for the step's record."""
    def backward(tensor: torch.Tensor, *args, **kwargs):
        if _ACTIVE and tensor.dim() == 0:
            _ACTIVE[0]._losses.append(tensor.detach())
        return original(tensor, *args, **kwargs)
    return backward
