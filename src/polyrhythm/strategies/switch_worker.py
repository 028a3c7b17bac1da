"""Strategy-Switch's worker side (the Strategy-Switch thesis, ch. 4): the `from` strategy (a
collective one) until its rule fires, then for good the `to` strategy (a parameter server's),
inside the running job.

The servers exist from the start and wait, idle, for the switch; the first phase's
collectives run among the workers only. The rule (strategies/switching.py) is asked before
training (once the run's length is known: a script tells it at its first step) and after
every epoch but the last, on figures every worker holds alike (worker 0's validation loss,
which a script logs, or the idleness, through one exact all-reduce), so all workers decide
the same. At the switch worker 0 hands each server its slices of the parameters and of the
optimizer's flat state (SGD's momentum buffer, Adam's moments and step count; a script's own
optimizer's as runtime/worker/user_optimizer.py flattens it), and the global step count, which the
servers' versions and learning-rate schedule carry on from (comm/messages.py,
runtime/server/server.py). From a script, the pushes after the switch carry its scheduler's rate, as
any parameter server's do. Buffers (BatchNorm statistics) stay in each worker's model, as in
every parameter-server strategy. Sync-Switch (Li et al., ICDCS 2021) switches instead by
checkpointing and relaunching the cluster.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.messages import HANDOVER
from polyrhythm.comm.transport import WORKERS
from polyrhythm.errors import ConfigError
from polyrhythm.optim import state_pieces
from polyrhythm.strategies.base import EpochEnd, Strategy
from polyrhythm.strategies.spec import STRATEGIES
from polyrhythm.strategies.switching import AtRule, EmpiricalRule, StragglerRule, rule_of


class SwitchWorker(Strategy):
    """The `from` strategy's worker, then the `to` strategy's, with the rule between."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        ctx, s = self.ctx, self.settings
        self.first, self.second = (
            STRATEGIES[half.name].build_worker(ctx, self.flat, self.batch_weight, half)
            for half in (s["from"], s.to))
        self.current = self.first
        # Built at the first step (start): a script tells the run's length only then.
        self.rule: AtRule | EmpiricalRule | StragglerRule | None = None
        self.steps = 0  # synchronous steps taken (each one update of a global batch)
        self.losses: list[float] = []  # the validation losses the rule has seen
        self.switch_epoch: int | None = None  # epochs done when the rule fired
        self.why = "the rule was never asked"  # its last answer's reason
        self.last_synchronous = 0.0  # ctx.now() when the last synchronous step ended
        self.switched_at: float | None = None
        self.finished_at = 0.0

    @property
    def names(self) -> tuple[str, str]:
        return self.settings["from"].name, self.settings.to.name

    def start(self) -> None:
        """Before the first step: the rule, for the run's epochs as they are known now (a
        script's job.epochs(n) has set them), and the switch if it fires before training."""
        self.rule = rule_of(self.settings, self.ctx.config.epochs)
        self.first.start()
        decision = self.rule.decide(0)
        if decision.switch:  # rule at with ⌊α·epochs⌋ = 0
            self.why = decision.why
            self._switch(0)

    def begin_step(self, epoch: int) -> None:
        # A script's scheduler's rate and settings, which pushes carry.
        self.current.rates, self.current.hyper = self.rates, self.hyper
        self.current.begin_step(epoch)

    def gradients_ready(self) -> None:
        self.current.gradients_ready()

    @property
    def updates_from(self) -> str | None:  # the phase's
        return self.current.updates_from

    def reduce_gradients(self) -> None:
        self.current.reduce_gradients()

    @property
    def workers_agree(self) -> bool:
        return self.current.workers_agree

    def step(self, epoch: int) -> None:
        self.current.step(epoch)
        if self.current is self.first:
            self.steps += 1
            self.last_synchronous = self.ctx.now()

    def end_epoch(self, end: EpochEnd) -> dict:
        fields = {"phase": self.names[self.current is self.second]}
        if (self.current is self.second or end.epochs_done >= self.ctx.config.epochs
                or self.rule is None):
            # One-way; after the last epoch nothing is left to switch; and an epoch that
            # ended before any step (a script's) has nothing to decide on.
            return fields
        idleness = None
        if self.rule.needs == "validation loss":
            fields |= end.validate()
            self.losses.append(self._agreed_loss(fields, end.epochs_done))
        elif self.rule.needs == "idleness":
            rows = self.ctx.transport.rows_of_members(
                torch.tensor([end.wait_s, end.iteration_s], dtype=torch.float64))
            # The most idle worker's: what waiting for the slowest costs the fastest.
            idleness = max(w / t if t > 0 else 0.0 for w, t in rows.tolist())
        decision = self.rule.decide(end.epochs_done, self.losses, idleness)
        fields |= {"rule_score": decision.score, "rule_fired": decision.switch,
                   "rule_why": decision.why}
        self.why = decision.why
        if decision.switch:
            self._switch(end.epochs_done)
        return fields

    def _agreed_loss(self, fields: dict, epochs_done: int) -> float:
        """The epoch's validation loss as every worker's rule reads it: worker 0's, so all
        decide alike even where a script logs another figure on each worker."""
        if "val_loss" not in fields:  # a script's epoch: what it logged
            raise ConfigError(f"switch's rule {self.settings.rule} reads each epoch's "
                              f"validation loss, and epoch {epochs_done} has none: log it "
                              "with job.log(val_loss=...) every epoch")
        row = torch.tensor([fields["val_loss"]], dtype=torch.float64)
        return float(self.ctx.transport.rows_of_members(row)[0, 0])

    def _switch(self, epochs_done: int) -> None:
        self._hand_over(switched=True)
        self.second.link.start_at(self.steps, self.flat.data)
        self.second.start()
        self.current, self.switch_epoch = self.second, epochs_done
        self.switched_at = self.ctx.now()

    def _hand_over(self, switched: bool) -> None:
        """The first worker left (worker 0 unless it was lost) sends each server its
        buckets' parameters and optimizer state (the optimizer copies of all workers are the
        same after a collective step)."""
        if self.ctx.rank != self.ctx.transport.members(WORKERS)[0]:
            return
        weights, optimizer = self.flat.data, self.first.optimizer
        tensors, values = state_pieces(optimizer.flat_state(), optimizer.state_keys,
                                       len(weights))
        sends = []
        for server, rank in enumerate(self.ctx.topology.server_ranks):
            ranges = [(a, b) for s, a, b in self.second.link.buckets if s == server]
            box = torch.cat([torch.tensor([float(switched), float(self.steps)]),
                             *(t[a:b] for t in (weights, *tensors) for a, b in ranges),
                             torch.tensor(values)])
            sends.append(self.ctx.transport.isend(box, rank, tag=HANDOVER))
        for work in sends:
            work.wait()

    def finish(self) -> None:
        if self.current is self.first:  # never switched: the servers hold the final model
            self.first.finish()
            self._hand_over(switched=False)
        self.second.finish()  # the servers serve until every worker has left
        self.finished_at = self.ctx.now()

    @property
    def stopped(self) -> bool:
        return self.current.stopped

    @property
    def servers_hold_model(self) -> bool:
        return self.current is self.second  # they wait, idle, until the handover

    @property
    def optimizer(self):
        """The optimizer the workers step, in the first phase (None after the switch: the
        servers step theirs)."""
        return getattr(self.first, "optimizer", None) if self.current is self.first else None

    @property
    def progress(self) -> float | None:
        return float(self.steps) if self.current is self.first else self.second.progress

    def summary(self) -> dict:
        """When it switched and what each phase took. switch_s: from this worker's last
        synchronous step to its first asynchronous push (the validation, the rule, the
        handover and the first step's compute between)."""
        first, then = self.names
        switched = self.switched_at is not None
        end_of_first = self.switched_at if switched else self.finished_at
        first_push = self.second.link.first_sent
        return {
            "switch_rule": self.settings.rule,
            "switch_epoch": self.switch_epoch,
            "switch_why": self.why,
            "switch_s": first_push - self.last_synchronous if switched and first_push else None,
            "switched_at_s": self.switched_at,
            "phase_s": {first: end_of_first, then: self.finished_at - end_of_first},
        }

    def state_dict(self) -> dict:
        return {"phase": int(self.current is self.second), "steps": self.steps,
                "losses": list(self.losses), "switch_epoch": self.switch_epoch,
                "first": self.first.state_dict(), "second": self.second.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.current = self.second if state["phase"] else self.first
        self.steps, self.losses = state["steps"], list(state["losses"])
        self.switch_epoch = state["switch_epoch"]
        self.first.load_state_dict(state["first"])
        self.second.load_state_dict(state["second"])
