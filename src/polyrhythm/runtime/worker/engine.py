"""One worker's engine, whoever writes its loop (a user's script through runtime/worker/script.py's
Job, polyrhythm train's job through runtime/worker/builtin.py): each step through the strategy with
its spans, iteration record and progress; each epoch's record, the strategy's end of it and
the checkpoint due; the state a checkpoint keeps; the report rank 0 gathers.
"""

from __future__ import annotations

import gc
import math
import time

import torch
from torch import nn

from polyrhythm.context import RankContext
from polyrhythm.errors import ConfigError, Diverged
from polyrhythm.flat import FlatParameters
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.runtime import checkpoint
from polyrhythm.runtime.survivors import lost_by_members
from polyrhythm.runtime.worker.agreement import check_agreement
from polyrhythm.runtime.worker.faults import dies_after, end_on_cue
from polyrhythm.strategies.base import EpochEnd

PROGRESS_INTERVAL_S = 0.25
# A worker's state's own entries (state_dict): what a script keeps (Job.keep) goes beside.
OWN_STATE = ("model", "optimizer", "rng", "strategy", "taken")
ITERATION_INTS = (0, 1, 2)  # an iteration row's worker, step and epoch; seconds after


class WorkerEngine:
    """One worker's steps, epochs, state and report. `ctx` None: a script run alone (one
    worker, nothing exchanged or recorded). `scripted`: a user's script joined by
    polyrhythm.init(), not polyrhythm train's job: its clock starts at its first step and
    rank 0 writes model.pt from worker 0's model. `describe_servers(engine)` tells the
    servers what they serve (at the first step)."""

    def __init__(self, ctx: RankContext | None, scripted: bool = False,
                 describe_servers=None) -> None:
        self.ctx, self.scripted = ctx, scripted
        self.workers = ctx.config.workers if ctx else 1
        self.worker = ctx.worker_index if ctx else 0
        self._describe_servers = describe_servers
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None  # None: the run's own steps
        self.step_optimizer = None  # a script's optimizer's own step (JobOptimizer.step_own)
        self.flat: FlatParameters | None = None
        self.strategy = None
        self.validation = None  # the built-in job's epoch validation (epoch_validation.py)
        self.epochs_done: list[dict] = []  # the records of the epochs done
        # Per iteration: (worker, step, epoch, t, compute, push, wait, pull, apply, total).
        self.iterations: list[tuple] = []
        self.steps_per_epoch: int | None = None  # known once a loader or sampler is made
        self.total_epochs: int | None = None  # known once the epochs are
        self.batch_size = 0  # examples a step, known once a loader is made (for records)
        self.losses: list[torch.Tensor] = []  # this step's backward losses
        self.compute_emulated = False  # a script's model computes through EmulatedForward
        self.epoch = 0
        self.kept: dict[str, object] = {}  # more state the checkpoints keep (Job.keep)
        self.logged: dict[str, float] = {}  # the figures logged for the epoch now
        self.hyper = None  # a script's optimizer's settings as pushes carry them (or None)
        self.group_of: list[int] | None = None  # a script's: each parameter's param group
        # Seconds of this step's exchange made before its step (a script's clip of the mean
        # gradient): not compute.
        self.exchanged_early = 0.0
        self.armed = False  # the strategy takes this step's gradients as backward makes them
        # The versions of the gradients job.backward(loss) sent as backward made them (None:
        # none sent before the step): the step checks that nothing changed them since.
        self.sent: list[int | None] | None = None
        self._taken, self._started, self._begun = 0, False, None
        self.resumed = False  # its state is a checkpoint's (ctx.resume), loaded
        # Resumed: the job's clock at the checkpoint's end of epoch, where it goes on from,
        # so that its records (iterations, epochs' wall time) carry on the run's time line.
        self.resumed_s = 0.0
        self._measured_from: float | None = None
        self._last_progress = 0.0
        config, i = ctx.config if ctx else None, self.worker
        self._delay = config.worker_delay_s[i] if ctx and i < len(config.worker_delay_s) else 0.0
        self._slowdown = config.slowdown[i] if ctx and i < len(config.slowdown) else 1.0
        self._dies_after = dies_after(config, i) if ctx else 0  # a fault on cue (faults.py)
        self._reset_epoch()

    @property
    def stopped(self) -> bool:
        """The job ended training before this worker's last step (k-BSP's servers end it
        once the run's rounds are done): its steps change nothing any more."""
        return self.strategy is not None and self.strategy.stopped

    # -- steps -------------------------------------------------------------------------

    def start(self) -> None:
        """Before the first step (once): the servers learn what they serve, the strategy
        starts receiving and, in a script, the clock starts."""
        if self._started:
            return
        if self.scripted and self.ctx.resume is not None and not self.resumed:
            raise ConfigError("a resumed script run goes on from job.epochs(n): this script "
                              "steps before calling it (or loops without it), so it cannot "
                              "be resumed")
        self._started = True
        # Everything built so far lives as long as the job: out of the collector's sight, a
        # full collection (80 ms of a step here, stretched by a --slowdown) skips it.
        gc.freeze()
        if self._describe_servers is not None:
            self._describe_servers(self)
        self.strategy.start()
        if self.scripted:  # a script's run: its clock starts with its first step
            self.ctx.start_clock(self.resumed_s)
        self._last = self._epoch_began = time.perf_counter()

    def begin_step(self) -> None:
        """The step's compute begins now (polyrhythm train's job calls it before each
        forward), and the strategy takes its gradients as backward makes them."""
        self.start()
        self._begun = time.perf_counter()
        self.arm()

    def arm(self) -> None:
        """From now until the step, the strategy takes this step's gradients as backward
        makes them (where it pushes bucket by bucket, each leaves once complete), at the
        settings the script's optimizer has now."""
        self.start()
        self._read_settings()
        self.strategy.begin_step(self.epoch)
        self.armed = True

    def _read_settings(self) -> None:
        """A script's optimizer's settings as its scheduler left them: each parameter's
        rate (Downpour's local steps read them) and what the pushes carry."""
        if self.optimizer is None:
            return
        groups = self.optimizer.param_groups
        self.strategy.rates = [float(groups[g]["lr"]) for g in self.group_of or ()]
        if self.hyper is not None:
            self.strategy.hyper = self.hyper.values()

    def gradient_versions(self) -> list[int | None]:
        """Each trained parameter's gradient's version (torch counts every in-place change
        of a tensor: a clip, an accumulation), None where it has none."""
        return [None if p.grad is None else p.grad._version for p in self.flat.params]

    def step(self, loss: float | None = None) -> None:
        """The step (a wrapped optimizer's `step()`): this worker's gradients through the
        strategy. `loss`: the step's training loss, if not the losses backward ran on."""
        computed = time.perf_counter()
        loss = self._step_loss() if loss is None else loss
        if self.ctx is None:
            self.step_optimizer()
        elif not self.stopped:
            self._exchange(computed, loss)
        self.armed, self.sent = False, None
        self._taken += 1
        end_on_cue(self._dies_after, self._taken)
        self._steps += 1
        if loss is not None and not math.isnan(loss):
            self._loss_sum, self._loss_steps = self._loss_sum + loss, self._loss_steps + 1

    def _exchange(self, computed: float, loss: float | None) -> None:
        ctx, config = self.ctx, self.ctx.config
        if loss is not None and not math.isfinite(loss):  # before its gradient reaches anyone
            raise Diverged(f"diverged at epoch {self.epoch + 1}, step {self._steps + 1}: "
                           f"training loss {loss}")
        self.start()
        began = self._begun if self._begun is not None else self._last
        if self.sent is not None:
            self._check_sent()
        if not self.armed:  # a script's loss.backward(): its gradients are final only now
            self._read_settings()
            self.strategy.begin_step(self.epoch)
            self.strategy.gradients_ready()
        self._begun = None
        if self._measured_from is None and self._taken >= self._warmup:
            self._measured_from = began
        if self._delay:
            time.sleep(self._delay)  # emulated slower compute
        if self._slowdown > 1:  # a slower node: this step's compute, stretched
            time.sleep((self._slowdown - 1) * (computed - began))
        # A push encoded while backward ran is the compress span's, not compute's.
        # So is reading the step's batch (the built-in job's), read's.
        compute = (time.perf_counter() - began - ctx.spans.current.get("compress", 0.0)
                   - ctx.spans.current.get("read", 0.0) - self.exchanged_early)
        self.exchanged_early = 0.0
        ctx.spans.totals["compute"] += compute
        self.strategy.step(self.epoch)
        ended = self._last = time.perf_counter()
        spans = ctx.spans.take()
        spans["compute"] = compute
        self._waited += spans.get("wait", 0.0)
        if config.instrumentation:
            self.iterations.append((self.worker, self._taken, self.epoch, began - ctx.started,
                                    *(spans.get(name, 0.0) for name in SPAN_NAMES),
                                    ended - began))
        self._progress(loss, ended)

    def _check_sent(self) -> None:
        """The gradients and settings job.backward(loss) sent are still the script's at
        its step: one line where the script changed them since, which the exchange would
        leave out (a clip after the push, a scheduler stepped in between)."""
        if self.gradient_versions() != self.sent:
            raise ConfigError("the gradients changed between job.backward(loss) and "
                              "opt.step() (a clip? another backward?), after job.backward "
                              "sent them: where the script changes its gradients before the "
                              "step, give the loss with job.backward(loss, exchange=False)")
        if self.hyper is not None and self.hyper.values() != self.strategy.hyper:
            raise ConfigError("the optimizer's settings changed between job.backward(loss) "
                              "and opt.step() (a scheduler stepped in between?), after the "
                              "step's pushes carried them: step the scheduler after opt.step()")

    def _step_loss(self) -> float | None:
        """The sum of the losses backward ran on since the last step (a script that
        accumulates gradients over k batches divides each loss by k: the sum is the mean)."""
        if not self.losses:
            return None
        loss = float(torch.stack([x.float() for x in self.losses]).sum())
        self.losses.clear()
        if self.compute_emulated:
            # The script's loss ran on the model's zero output: a figure of the targets, not
            # of the model, which learns nothing. Recorded, it would read as a training
            # curve in report and compare; the step's loss is unknown (NaN), as polyrhythm
            # train's emulated steps record it. Unless it is not finite: its gradients
            # would then be NaN, and the run diverge for want of a real output.
            if not math.isfinite(loss):
                raise ConfigError(f"under emulated compute the model's output is zeros and "
                                  f"the script's loss on them is {loss}: emulated compute "
                                  "needs a loss that is finite on a zero output")
            return None
        return loss

    def _progress(self, loss: float | None, now: float) -> None:
        steps = self.steps_per_epoch
        if (steps is None or self._steps + 1 < steps) and \
                now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        seconds = now - self._epoch_began
        self.ctx.progress({"rank": self.ctx.rank, "worker": self.worker,
                           "epoch": self.epoch + 1, "epochs": self.total_epochs,
                           "step": self._steps + 1, "steps": steps,
                           "loss": math.nan if loss is None else loss,
                           "samples_per_s": (self._steps + 1) * self.batch_size / seconds
                           if seconds > 0 else 0.0})

    # -- epochs ------------------------------------------------------------------------

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _reset_epoch(self) -> None:
        self._steps, self._loss_sum, self._loss_steps, self._waited = 0, 0.0, 0, 0.0
        self._epoch_began = self._last = time.perf_counter()
        self._measured_from = None  # the epoch's first step after the warm-up, when taken
        self.logged = {}

    @property
    def _warmup(self) -> int:
        return self.ctx.config.warmup_steps if self.ctx else 0

    def end_epoch(self) -> None:
        """The epoch ends: its record, the strategy's end of it (where its rule may want the
        validation now), the checkpoint if one is due."""
        ended = time.perf_counter()
        seconds = ended - self._epoch_began
        record = {"epoch": self.epoch,
                  "train_loss": self._loss_sum / self._loss_steps if self._loss_steps
                  else math.nan,
                  "samples": self._steps * self.batch_size, "seconds": seconds,
                  "wall_s": ended - (self.ctx.started if self.ctx else self._epoch_began)}
        # Throughput leaves out the warm-up steps (first iterations pay for lazy set-up).
        measured = min(self._steps, self._taken - self._warmup)
        if self._measured_from is not None and measured > 0:
            record["measured_samples"] = measured * self.batch_size
            record["measured_seconds"] = ended - self._measured_from
        else:
            record["measured_samples"], record["measured_seconds"] = 0, 0.0
        if self.ctx is not None and self.strategy is not None:
            if not torch.isfinite(self.flat.data).all():
                raise Diverged(f"diverged at epoch {self.epoch + 1}, step {self._steps}: "
                               "non-finite parameters")
            check_agreement(self)
            logged = dict(self.logged)
            validate = self.validation.now if self.validation else lambda: logged
            record |= self.strategy.end_epoch(EpochEnd(self.epoch + 1, self._waited,
                                                       seconds, validate))
            if self.validation:
                self.validation.keep(self.epoch)
        record |= self.logged
        self.epochs_done.append(record)
        self._checkpoint(len(self.epochs_done))
        self._reset_epoch()

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The model (parameters and buffers), the strategy's worker side, the script's
        optimizer, what `keep` named, the steps taken and the random state: what this
        worker needs to carry on. Copies, as every piece's state is: training on does not
        change a state taken."""
        state = {"model": {k: v.clone() for k, v in self.model.state_dict().items()},
                 "strategy": self.strategy.state_dict(), "taken": self._taken,
                 "rng": torch.get_rng_state()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state | {name: obj.state_dict() for name, obj in self.kept.items()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.strategy.load_state_dict(state["strategy"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        for name, obj in self.kept.items():
            obj.load_state_dict(state[name])
        self._taken = state["taken"]
        torch.set_rng_state(state["rng"])

    def checkpoint_state(self) -> dict:
        """This worker's part of a checkpoint: its state, and what its report needs of the
        epochs done (their records; the validation's)."""
        state = {"worker": self.state_dict(), "epochs": self.epochs_done,
                 "iterations": checkpoint.packed(self.iterations)}
        if self.validation is not None:
            state["validation"] = self.validation.state_dict()
        return state

    def resume(self, resume) -> None:
        """Carry on from a checkpoint (runtime/checkpoint.py Resume)."""
        state = resume.load(f"worker-{self.worker}.pt")
        self.load_state_dict(state["worker"])
        self.epochs_done = list(state["epochs"])
        self.iterations = checkpoint.unpacked(state.get("iterations", checkpoint.packed([])),
                                              ITERATION_INTS)
        self.resumed_s = self.epochs_done[-1]["wall_s"] if self.epochs_done else 0.0
        if self.validation is not None:
            self.validation.load_state_dict(state["validation"], len(self.epochs_done))
        self._reset_epoch()
        self.resumed = True

    def _checkpoint(self, epochs_done: int) -> None:
        """This worker's files of the checkpoint after `epochs_done` epochs, if one is due
        (the snapshots of the epochs it holds are written already, as each ended)."""
        ctx = self.ctx
        if ctx is None or ctx.run_dir is None or not checkpoint.is_due(ctx.config, epochs_done):
            return
        folder = checkpoint.epoch_dir(ctx.run_dir, epochs_done)
        if self.worker == 0:
            if self.strategy.servers_hold_model:
                checkpoint.mark_servers_expected(ctx.run_dir, epochs_done)
            # The workers' momentum where they step the model (the servers' replaces it once
            # the checkpoint is complete, where they hold it: complete_model).
            momentum = getattr(getattr(self.strategy, "optimizer", None), "buffer", None)
            names = {id(p): name for name, p in self.model.named_parameters()}
            checkpoint.save({"model": self.model.state_dict(),
                             "optimizer": checkpoint.plain_sgd_state(
                                 self.flat, momentum, [names[id(p)] for p in self.flat.params])},
                            folder / checkpoint.MODEL)
        own = [f"worker-{self.worker}.pt"] + ([checkpoint.MODEL, checkpoint.SERVERS_EXPECTED]
                                              if self.worker == 0 else [])
        checkpoint.save(self.checkpoint_state(), folder / own[0])
        config = ctx.config
        checkpoint.complete_model(ctx.run_dir, epochs_done, config.workers, config.servers)
        checkpoint.prune(ctx.run_dir, own, config.workers, config.servers)

    # -- the report --------------------------------------------------------------------

    def report(self, lost: set[int]) -> dict:
        """This worker's report, once every survivor knows which workers were lost (`lost`,
        their indices: runtime/survivors.py). The first worker left validates the epochs
        not validated yet (the built-in job's), and hands in what rank 0 needs of the final
        model: where no server holds it, its flat parameters; in a script, its model's state
        and its trained parameters' names in flat order."""
        ctx = self.ctx
        final = self.flat.data.clone()
        first = min(set(range(self.workers)) - lost)
        me = self.worker
        statistics = None
        if self.validation is not None:
            statistics = self.validation.after_training(self.epochs_done, lost, me == first)
        report = {"role": "worker", "rank": ctx.rank, "worker": me, "epochs": self.epochs_done,
                  "steps": self._taken, "batch_size": self.batch_size,
                  "spans": dict(ctx.spans.totals),
                  "traffic": ctx.transport.counters.snapshot(), "iterations": self.iterations,
                  "lost": lost_by_members(ctx),
                  "strategy": self.strategy.summary(), "shapes": self.flat.shapes}
        if me != first:
            return report
        if self.scripted:
            # Its state, and which trained parameter (by flat order) each of its entries
            # is: tied ones (an output layer sharing the embedding) name the same.
            index = {id(p): i for i, p in enumerate(self.flat.params)}
            report["model"] = {k: v.clone() for k, v in self.model.state_dict().items()}
            report["aliases"] = {name: index[id(p)] for name, p in
                                 self.model.named_parameters(remove_duplicate=False)
                                 if id(p) in index}
        if not ctx.topology.servers:  # no server holds the model
            report["shard"] = (0, len(self.flat), final)
        if statistics is not None:
            report["statistics"] = statistics
        return report

