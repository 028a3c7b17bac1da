"""One parameter-server shard: a flat slice of the parameters, its optimizer, and one loop.

The loop is the same for every consistency model: receive a push from any worker, ask the
policy what to do, accumulate / apply / reply (message layout in comm/messages.py).
"""

from __future__ import annotations

import math
import time

import torch

from polyrhythm.comm.messages import DONE, PUSH_HEADER, REPLY_HEADER
from polyrhythm.context import RankContext
from polyrhythm.metrics.recorder import StalenessLog
from polyrhythm.optim import lr_at, make_sgd, set_lr
from polyrhythm.strategies.consistency import ConsistencyPolicy, Decision


class ParameterServerShard:
    """Owns parameters [start, stop) of the flat model and applies workers' gradients to them."""

    def __init__(self, ctx: RankContext, initial: torch.Tensor, start: int, stop: int,
                 policy: ConsistencyPolicy, steps_per_epoch: int) -> None:
        self.ctx = ctx
        self.start, self.stop = start, stop
        # The reply message is [version, weights...]: the weights live inside it, so answering
        # a worker sends this buffer as it is, with no copy.
        self.outbox = torch.cat([torch.zeros(REPLY_HEADER), initial[start:stop]])
        self.weights = torch.nn.Parameter(self.outbox[REPLY_HEADER:])
        self.optimizer = make_sgd([self.weights], ctx.config, policy.asynchronous)
        self.pending = torch.zeros_like(self.weights)
        self.pending_weight = 0.0
        self.policy = policy
        self.steps_per_epoch = steps_per_epoch
        self.version = 0  # weight updates applied so far
        self.progress = 0.0  # global steps' worth of gradient applied (drives lr decay)
        self.staleness = StalenessLog()

    def run(self) -> dict:
        """Serve until every worker has said it is done; return this shard's report."""
        inbox = torch.empty(PUSH_HEADER + self.stop - self.start)
        remaining = self.ctx.topology.workers
        while remaining:
            src = self.ctx.transport.recv_any(inbox)
            worker = self.ctx.topology.worker_index(src)
            kind, clock, pulled, weight = inbox[:PUSH_HEADER].tolist()
            if kind == DONE:
                remaining -= 1
                decision = self.policy.on_done(worker)
            else:
                decision = self.policy.on_push(worker, int(clock))
                self._accumulate(decision, inbox[PUSH_HEADER:], weight, int(pulled))
            self._act(decision)
        return self._report()

    def _accumulate(self, decision: Decision, grad: torch.Tensor, weight: float,
                    pulled: int) -> None:
        if decision.accumulate:
            self.pending.add_(grad, alpha=weight)
            self.pending_weight += weight
            self.staleness.record(self.version - pulled)

    def _act(self, decision: Decision) -> None:
        if decision.update and self.pending_weight > 0:
            with self.ctx.spans("update"):
                self._apply()
        if decision.release:
            self._reply(decision.release)

    def _apply(self) -> None:
        # Small tolerance: weights like 1/3 do not sum to exact integers in floating point.
        epoch = math.floor(self.progress / self.steps_per_epoch + 1e-6)
        set_lr(self.optimizer, lr_at(self.ctx.config, epoch))
        self.weights.grad = self.pending
        self.optimizer.step()
        self.pending.zero_()
        self.progress += self.pending_weight
        self.pending_weight = 0.0
        self.version += 1
        self.outbox[0] = self.version

    def _reply(self, workers: tuple[int, ...]) -> None:
        ranks = [self.ctx.topology.worker_ranks[w] for w in workers]
        for work in [self.ctx.transport.isend(self.outbox, r) for r in ranks]:
            work.wait()

    def _report(self) -> dict:
        return {
            "role": "server",
            "rank": self.ctx.rank,
            "shard": (self.start, self.stop, self.weights.detach().clone()),
            "weight_updates": self.version,
            "momentum": self.optimizer.param_groups[0]["momentum"],
            "update_s": self.ctx.spans.totals["update"],
            "staleness_histogram": dict(self.staleness.histogram),
            "traffic": vars(self.ctx.transport.counters),
            "finished_at": time.time(),
        }
