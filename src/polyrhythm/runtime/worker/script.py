"""A training script as a polyrhythm worker: `Job` (what `polyrhythm.init()` returns on a
worker) wraps the script's model and optimizer so that `opt.step()` makes the strategy's
exchange, hands out this worker's shard of the data, counts its steps and epochs, keeps what
the script logs, writes its checkpoints and reports what it did. What joins the job and what
happens on server ranks is launch/rank/script_rank.py's. polyrhythm train's built-in job
is a script on this class too (runtime/worker/builtin.py): there is one worker loop.

The script's loop stays the script's: its forward, its loss, its backward, gradient clipping
or accumulation, its scheduler. `job.wrap` returns the script's optimizer as a JobOptimizer
(runtime/worker/job_optimizer.py) whose `step()` is the job's. At that step the gradients in the
model are this worker's (after whatever the script did to them); the strategy sends them or
all-reduces them, and the model holds the next parameters when the call returns. Given by
`job.backward(loss)` instead, the loss is recorded and the gradients leave as backward makes
them, where the strategy pushes bucket by bucket (the parameter-server strategies): the
communication overlaps the backward pass, as in polyrhythm train's job. Where the workers
step an optimizer themselves (all-reduce, local SGD, ...), it is the script's; where servers
do, they rebuild it on their slices (runtime/worker/user_optimizer.py) and step each group at the
settings each push carries, as the script's scheduler left them.
A script may also leave the optimizer to the run (`job.wrap(model)`, then `job.step()`): the
[optimizer] settings and schedule, as polyrhythm train's job does. Under emulated compute
the wrapped model sleeps for each step's compute time instead of computing, and returns
zeros of its output's shapes (runtime/worker/compute.py): the rest of the loop runs as it is.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from polyrhythm.comm.transport import WORKERS
from polyrhythm.config import OPTIMIZER, RunConfig
from polyrhythm.config.emulation import compute_times
from polyrhythm.context import RankContext
from polyrhythm.errors import ConfigError
from polyrhythm.flat import FlatParameters, RunningStatistics
from polyrhythm.runtime.worker.agreement import check_same_start
from polyrhythm.runtime.worker.compute import EmulatedForward
from polyrhythm.runtime.worker.engine import OWN_STATE, WorkerEngine
from polyrhythm.runtime.worker.job_optimizer import JobOptimizer, guard_steps
from polyrhythm.runtime.worker.script_data import EpochOfBatches, ShardSampler, shard_loader
from polyrhythm.runtime.worker.user_optimizer import (
    Hyperparameters,
    UserOptimizer,
    optimizer_spec,
    trained_parameters,
)
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.spec import EVERY_WORKERS


def lasting(config: RunConfig, epochs: int) -> RunConfig:
    """The run's config with the script's number of epochs (a worker's job.epochs(n), and
    the servers once worker 0 tells them) in place of the config's."""
    return config if epochs == config.epochs else RunConfig(**{**config.given,
                                                                "epochs": epochs})


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step needs a closure (LBFGS: it re-evaluates the loss)."""
    closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


class Job(WorkerEngine):
    """One worker's side of a job: what its script calls (the steps, epochs, state and
    report are its WorkerEngine's). `ctx` None: a plain `python script.py`, one worker and
    nothing to exchange (the script runs as it would without polyrhythm; nothing is
    recorded)."""

    def __init__(self, ctx: RankContext | None, describe_servers=None, finish=None,
                 given: frozenset[str] | None = None) -> None:
        """`describe_servers(job)` tells the servers what they serve (at the first step);
        `finish(job)` hands in the report and leaves the job (launch/rank/script_rank.py). `given`:
        the settings the user set that only some scripts read (the run's epochs and
        [optimizer]), refused where this one does not (None: unknown, not checked)."""
        super().__init__(ctx, scripted=finish is not None, describe_servers=describe_servers)
        self.given = given
        self._finish = finish
        self.servers_spec = None  # the optimizer the servers rebuild (user_optimizer.py)
        self.ended_pass = False  # a loader pass ended the epoch, which ends at the next
        self.finished = False  # job.finish() was called: the model is the run's final one
        self.final_rank: int | None = None  # the rank that saves it (the first worker left)
        self._evaluate = None  # the script's evaluation of the final model (job.finish)
        self._share = 1.0  # this worker's share of each global batch
        self._samplers: weakref.WeakSet[ShardSampler] = weakref.WeakSet()
        self.wrapped: JobOptimizer | None = None  # what job.wrap returned of the optimizer
        # In a script's job, stepping any optimizer but the job's is one line
        # (job_optimizer.py); a job let go of unfinished (an error) no longer guards.
        this = weakref.ref(self)
        self._guard = None if ctx is None or not self.scripted else \
            register_optimizer_step_pre_hook(guard_steps(
                lambda: job.wrapped if (job := this()) is not None else False))

    # -- the script's calls ------------------------------------------------------------

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
             batch_share: float | None = None) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """The model as this job trains it (the same object) and the optimizer to step: a
        JobOptimizer (runtime/worker/job_optimizer.py) whose groups and state are `optimizer`'s and
        whose `step()` makes the strategy's exchange. No optimizer: the run's own steps (its
        [optimizer] settings and schedule) at each `job.step()`. Every worker must build the
        same initial model (seed it): one line says which does not.
        `batch_share`: this worker's share of each global batch, where the workers' batches
        differ in size (1/workers by default)."""
        if self.model is not None or isinstance(optimizer, JobOptimizer):
            raise ConfigError("job.wrap was called twice: wrap the model and optimizer once")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"job.wrap takes a torch.optim optimizer, not "
                              f"{type(optimizer).__name__}")
        if optimizer is None and self.ctx is None:
            raise ConfigError("job.wrap needs the script's optimizer when it runs alone")
        if optimizer is not None and needs_closure(optimizer):
            raise ConfigError(f"{type(optimizer).__name__} steps with a closure that "
                              "re-evaluates the loss, which no strategy can share: wrap an "
                              "optimizer that steps once per gradient (SGD, Adam, ...)")
        self.model, self.optimizer = model, optimizer
        if optimizer is not None:
            self.wrapped = JobOptimizer(optimizer, self.step)
            self.step_optimizer = self.wrapped.step_own
        if self.ctx is None:
            return model, self.wrapped
        self.flat = FlatParameters(model)
        if self.scripted:  # the built-in job builds every worker's from the run's seed
            check_same_start(self.ctx.transport, self.flat)
        ctx, config = self.ctx, self.ctx.config
        spec = STRATEGIES[config.strategy.name]
        if optimizer is not None:
            self._refuse_given(optimizer)
            if ctx.topology.servers:  # before anything else can fail on one worker only
                self.servers_spec = optimizer_spec(optimizer, self.flat, config.strategy.name)
                self.hyper = Hyperparameters(optimizer)
                ctx.push_hyper_words = self.servers_spec.push_words
            self.group_of = trained_parameters(optimizer, self.flat)
            ctx.user_optimizer = UserOptimizer(optimizer, self.flat, self.wrapped.step_own)
        share = self._share = 1.0 / self.workers if batch_share is None else batch_share
        self.strategy = spec.build_worker(ctx, self.flat, share, config.strategy)
        if optimizer is not None and self.strategy.local_sgd \
                and type(optimizer) is not torch.optim.SGD:
            raise ConfigError(f"{config.strategy.name} with fetch_every > 1 steps each "
                              "worker's replica with plain SGD between fetches (at each param "
                              f"group's lr), not {type(optimizer).__name__}: wrap a "
                              "torch.optim.SGD, or fetch every step")
        self._emulate_compute(model)
        return model, self.wrapped

    def backward(self, loss: torch.Tensor, *, exchange: bool = True) -> None:
        """`loss.backward()`, the job told the loss: a step's training loss is the sum of
        the losses given since the last step (accumulating over k batches with
        job.backward(loss / k) records their mean). Where the strategy sends gradients as
        backward makes them (the parameter-server strategies, bucket by bucket from the last
        layer back), this step's leave while backward runs. `exchange=False`: not yet, the
        exchange is made at `opt.step()` from the gradients as they are then: for each
        backward of an accumulation but the step's last, or where the script changes its
        gradients before stepping (a clip). After job.backward(loss) they must stay as they
        are until `opt.step()` (one line otherwise). A plain `loss.backward()` trains alike,
        with no overlap and the step's loss unknown (NaN in the records)."""
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ConfigError("job.backward takes the step's loss, a scalar tensor, not "
                              f"{type(loss).__name__}"
                              f"{'' if not isinstance(loss, torch.Tensor) else tuple(loss.shape)}")
        if self.sent is not None:
            raise ConfigError("job.backward(loss) came twice before opt.step(): the first "
                              "sent the step's gradients; accumulate with "
                              "job.backward(loss, exchange=False), and give the last without")
        self.losses.append(loss.detach())
        overlap = exchange and self.ctx is not None and self.strategy is not None \
            and not self.stopped
        if overlap:
            self.arm()
        loss.backward()
        if overlap:
            self.sent = self.gradient_versions()

    def epochs(self, n: int) -> Iterator[int]:
        """The epochs to train, from the first not done (a resumed run's); each ends when
        the script moves on to the next. `n` is the run's length from then on, in place of
        the config's (a Strategy-Switch rule at a share of the epochs reads it)."""
        if self.ctx is not None and self.given and "epochs" in self.given \
                and n != self.ctx.config.epochs:
            raise ConfigError(f"--epochs {self.ctx.config.epochs} was given, but the script "
                              f"runs job.epochs({n}), which is the run's length: drop --epochs")
        self.total_epochs = n
        if self.ctx is not None:
            self.ctx.config = lasting(self.ctx.config, n)
            if self.ctx.resume is not None and not self.resumed:
                self._resume_here()
        for epoch in range(len(self.epochs_done), n):
            self.begin_epoch(epoch)
            yield epoch
            self.end_epoch()

    def start(self) -> None:
        """Before the first step: a Strategy-Switch rule at a share of the epochs needs to
        know how many there are (job.epochs(n), or --epochs)."""
        strategy = self.ctx.config.strategy
        if not self._started and self.given is not None and self.total_epochs is None \
                and "epochs" not in self.given and strategy.name == "switch" \
                and strategy.rule == "at":
            raise ConfigError(f"switch's rule at switches after {strategy.at:g} of the "
                              "run's epochs, but the script does not say how many it runs: "
                              "loop on job.epochs(n), or give --epochs")
        super().start()

    def _refuse_given(self, optimizer: torch.optim.Optimizer) -> None:
        """The run's [optimizer] settings, which the user set, steer nothing where the
        script steps an optimizer of its own: one line rather than a setting dropped."""
        flags = sorted(p.flag for p in OPTIMIZER if p.name in (self.given or ()))
        if flags:
            raise ConfigError(f"{' and '.join(flags)} set the run's own optimizer, but the "
                              f"script steps its own ({type(optimizer).__name__}): set them "
                              "in the script, or wrap no optimizer (job.wrap(model)) to train "
                              "with the run's")

    def sampler(self, dataset, shuffle: bool = True, seed: int = 0) -> ShardSampler:
        """A sampler of this worker's shard of `dataset` for the script's own DataLoader
        (torch.utils.data.DataLoader(dataset, batch_size, sampler=job.sampler(dataset)))."""
        seed = self.ctx.config.seed if self.ctx else seed
        sampler = ShardSampler(len(dataset), self.worker, self.workers, shuffle, seed)
        sampler.epoch = self.epoch  # made anew each epoch, it still shuffles for the epoch
        self._samplers.add(sampler)
        return sampler

    def loader(self, dataset, batch_size: int, shuffle: bool = True, **kwargs) -> Iterable:
        """This worker's batches of its shard of `dataset` (`batch_size` per worker, as in
        DDP), reshuffled each epoch: a torch DataLoader over `sampler`."""
        loader = shard_loader(self.sampler(dataset, shuffle), dataset, batch_size, **kwargs)
        self.steps_per_epoch, self.batch_size = len(loader), batch_size
        return EpochOfBatches(self, loader)

    def log(self, **metrics: float) -> None:
        """Figures of the epoch now: val_loss and val_accuracy are stored with the epoch (what
        report and compare read) and a Strategy-Switch rule reads val_loss; other names are
        kept in the worker's epoch record only, not in the store's epoch rows (yet)."""
        for name, value in metrics.items():
            value = float(value.item() if isinstance(value, torch.Tensor) else value)
            self.logged[name] = value

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradient this step's update applies, as torch.nn.utils.clip_grad_norm_
        clips one process's, and return its norm; call it between backward and opt.step()
        (Horovod's synchronize() then clip). Where every update applies the mean of every
        worker's gradient (allreduce, ring, tree, reduce-broadcast, bsp, a Strategy-Switch's
        synchronous phase), that mean is made now and clipped, as DDP's averaged gradient is
        after its backward (the step then sends it as it is). Where an update applies one
        worker's gradient (asp, ssp, downpour, the averaging strategies' local steps) or a
        quorum's that only the servers gather (kbsp, kasp, backup, softsync), this worker's
        own: every gradient the servers take is then clipped."""
        if self.sent is not None:
            raise ConfigError("job.clip_grad_norm_ came after job.backward(loss), which sent "
                              "the step's gradients as backward made them: give that loss "
                              "with job.backward(loss, exchange=False) to clip before the "
                              "exchange")
        params = self.flat.params if self.flat is not None else list(self.model.parameters())
        # One worker's gradient is the mean already: nothing to make (no collective a step).
        if self.ctx is not None and self.workers > 1 \
                and self.strategy.updates_from == EVERY_WORKERS:
            self.start()
            began = time.perf_counter()
            self.strategy.reduce_gradients()
            self.exchanged_early += time.perf_counter() - began
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)

    def mean(self, value: float) -> float:
        """The mean of `value` over the workers, the same on every worker (every worker calls
        it together): a figure a scheduler steps on (ReduceLROnPlateau's), so that workers
        whose models must agree (allreduce) step alike rather than each on its own."""
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        if self.ctx is None:
            return value
        rows = self.ctx.transport.rows_of_members(torch.tensor([value], dtype=torch.float64))
        return float(rows.mean())

    def keep(self, name: str, obj) -> None:
        """Keep `obj`'s state (its state_dict and load_state_dict: a scheduler, a data
        position, ...) in this worker's checkpoints under `name`; a resumed run loads it at
        job.epochs(n), so keep it before."""
        if name in OWN_STATE:
            raise ConfigError(f"job.keep cannot take the name {name!r}: the checkpoint keeps "
                              f"its own {name} there (names taken: {', '.join(OWN_STATE)})")
        if self.resumed and name not in self.kept:
            raise ConfigError(f"job.keep({name!r}) came after job.epochs(n) loaded the "
                              "resumed run's state: keep it before job.epochs, so that its "
                              "state is loaded with the rest")
        self.kept[name] = obj

    def finish(self, evaluate: Callable[[nn.Module], dict | float] | None = None) -> None:
        """The script is done: this worker leaves its servers or peers and, once the job
        has agreed on it, holds the run's final model (the parameters as the strategy ended
        them: the servers' where they hold the model, the workers' consensus where they
        average; every tie kept; buffers such as BatchNorm's statistics the workers'
        batch-weighted mean). In a script the run is recorded (rank 0), with `model.pt` that
        model, and this process leaves the job. `evaluate(model)`: the script's evaluation
        (a dict of figures, val_loss and val_accuracy among them, or a val_loss), run once,
        by the first worker, on the final model: the run's final figures (without it they
        are unknown, NaN: what a worker logged last was of its own model)."""
        if self.finished:
            raise ConfigError("job.finish() was called twice: call it once, after training")
        if self._guard is not None:  # training is over: the script's optimizers are its own
            self._guard.remove()
        self.close_pass()
        self._evaluate = evaluate
        if self.ctx is not None and self.strategy is not None:
            self.start()
            self.strategy.finish()  # decentralised strategies may agree on a final model
        if self._finish is not None:
            self._finish(self)
        elif self.ctx is None and evaluate is not None and self.model is not None:
            self.final_figures()  # a plain run: its one worker's model is the final one
        self.finished = True

    def save(self, path) -> None:
        """Write the run's final model's state_dict to `path` (torch.save), once for the
        whole job: by the first worker left (alone, by this process). After job.finish(),
        which makes the model the final one."""
        if not self.finished:
            raise ConfigError("job.save(path) writes the run's final model: call it after "
                              "job.finish() (before, each worker holds a model of its own)")
        if self.ctx is None or self.ctx.rank == self.final_rank:
            torch.save(self.model.state_dict(), path)

    def take_final(self, flat: torch.Tensor, first_rank: int) -> None:
        """The run's final parameters (every worker's, once the job agreed on them), and
        the rank that saves and evaluates them (launch/rank/script_rank.py)."""
        self.flat.data.copy_(flat)
        self.final_rank = first_rank

    def final_figures(self) -> dict[str, float] | None:
        """The script's evaluation of the final model (job.finish(evaluate=...)), as floats;
        None without one."""
        if self._evaluate is None:
            return None
        figures = self._evaluate(self.model)
        if isinstance(figures, int | float | torch.Tensor):
            figures = {"val_loss": figures}
        if not isinstance(figures, dict):
            raise ConfigError(f"job.finish(evaluate=...) returned {type(figures).__name__}: "
                              "return a dict of figures (val_loss=..., val_accuracy=...) or "
                              "a val_loss")
        return {str(k): float(v.item() if isinstance(v, torch.Tensor) else v)
                for k, v in figures.items()}

    def agree_on_statistics(self) -> None:
        """Every worker's buffers (BatchNorm's running statistics) become the workers'
        batch-weighted mean: one all-reduce among the workers left, whose shares it adds up
        too (a lost worker's no longer count)."""
        statistics = RunningStatistics(self.model)
        if not statistics:
            return
        share = torch.tensor([self._share], dtype=torch.float64)
        values = torch.cat([statistics.get() * self._share, share])
        with self.ctx.transport.uncounted():  # after training: not the training's traffic
            self.ctx.transport.all_reduce(values, WORKERS)
        statistics.set(values[:-1] / values[-1])

    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        for sampler in self._samplers:  # those the script keeps from epoch to epoch
            sampler.epoch = epoch

    def close_pass(self) -> bool:
        """End the epoch a loader pass ended, if one did (EpochOfBatches)."""
        if not self.ended_pass:
            return False
        self.ended_pass = False
        self.end_epoch()
        return True

    def _emulate_compute(self, model: nn.Module) -> None:
        """Under emulated compute, a script's model sleeps for each step's compute time and
        returns zeros of its output's shapes instead of computing (runtime/worker/compute.py).
        polyrhythm train's job emulates its steps itself, without data or a forward."""
        if not self.scripted:
            return
        seconds = compute_times(self.ctx.config, self.worker)
        if seconds is not None:
            model.forward = EmulatedForward(model, seconds, lambda: self._taken)
            self.compute_emulated = True

    def _resume_here(self) -> None:
        """A resumed run's worker state (model, optimizer, what job.keep named, steps, epochs
        done) from its checkpoint, loaded as the script's epochs begin: everything it keeps
        exists by then."""
        if self.model is None:
            raise ConfigError("a resumed run loads its model at job.epochs(n): call "
                              "job.wrap(model, opt) before it")
        self.resume(self.ctx.resume)
