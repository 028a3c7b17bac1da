"""Worker side of the parameter-server family (BSP, ASP, SSP, k-BSP, ..., Downpour): push, pull.

The consistency model lives entirely on the servers (strategies/consistency.py). The model is
split into buckets, each owned by one server. During backward, a hook pushes each bucket's
gradient the moment every parameter in it has one (the last layers first), so pushes, server
updates and replies overlap the rest of backward, as in DDP's bucketing or BytePS. After
backward the worker pushes whatever is left and waits for every bucket's reply: how long it
waits is the policy's decision.
"""

from __future__ import annotations

from functools import partial

import torch

from polyrhythm.comm.messages import PUSH_HEADER, REPLY_HEADER
from polyrhythm.comm.transport import WORKERS
from polyrhythm.compression.buckets import WorkerCodecs, compressing
from polyrhythm.compression.wire import bucket_words
from polyrhythm.context import RankContext
from polyrhythm.flat import FlatParameters
from polyrhythm.layout import BucketLayout
from polyrhythm.optim import lr_at
from polyrhythm.strategies.allreduce import into_model
from polyrhythm.strategies.base import Strategy
from polyrhythm.strategies.cadence import PushFetch
from polyrhythm.strategies.serving import DONE, FETCH, GRADIENT, PUSH


class ServerLink:
    """A worker's side of the PS protocol (comm/messages.py): one outbox and one inbox per
    bucket, and the server version each bucket was last pulled at. Under compression
    (compression/buckets.py) a push carries its bucket's encoded values, and, with compressed
    replies, a reply the change of the bucket since the worker's copy of it."""

    def __init__(self, ctx: RankContext, flat: FlatParameters, weight: float, *,
                 replies_are_the_model: bool = False) -> None:
        """`replies_are_the_model`: the replies are the model's next parameters (not, as
        EASGD's, a centre of its own), so a single uncompressed bucket's reply may be
        received straight into the model (`FlatParameters.with_header`)."""
        self.ctx, self.weight = ctx, weight
        config = ctx.config
        layout = BucketLayout(len(flat), ctx.topology.servers, config.bucket_kb)
        self.buckets = layout.buckets  # (server, start, stop) by bucket id
        self.codecs = None
        if compressing(config.compression):
            self.codecs = WorkerCodecs(config.compression, self.buckets, flat.shapes,
                                       flat.data, ctx.worker_index, config.seed)
        pushes = bucket_words(config.compression, self.buckets, flat.shapes)
        replies = bucket_words(config.compression, self.buckets, flat.shapes, replies=True)
        capacity = {s: max(w for (t, _, _), w in zip(self.buckets, pushes, strict=True)
                           if t == s) for s, _, _ in self.buckets}  # pushes are padded to it
        # A script's optimizer's settings ride between the header and the values.
        self.head = PUSH_HEADER + ctx.push_hyper_words
        self.outbox = [torch.zeros(self.head + capacity[s]) for s, _, _ in self.buckets]
        self.inbox = [torch.empty(REPLY_HEADER + words) for words in replies]
        # The reply is received where wait_replies would copy it to: nothing to copy.
        self.in_place = replies_are_the_model and len(self.buckets) == 1 and self.codecs is None
        if self.in_place:
            self.inbox = [flat.with_header(REPLY_HEADER)]
        self.pulled = [0] * len(self.buckets)
        self.over = False  # a server ended training (its reply said so)
        self.progress = 0.0  # global batches applied, as the last replies said (the least)
        self.sends: list = [None] * len(self.buckets)
        self.receives: list = []
        self.first_sent: float | None = None  # when the first message left (ctx.now())
        self.hyper: torch.Tensor | None = None  # the settings pushes carry (float64 words)

    def expect_replies(self) -> None:
        """Post every bucket's receive before sending, so a reply never waits for it."""
        ranks = self.ctx.topology.server_ranks
        self.receives = [self.ctx.transport.irecv(box, ranks[s], tag=k)
                         for k, (box, (s, _, _)) in enumerate(
                             zip(self.inbox, self.buckets, strict=True))]

    def send(self, k: int, kind: int, clock: int, values: torch.Tensor | None = None) -> None:
        """Send bucket k's message; `values` is the whole flat vector the slice is cut from
        (None: a gradient already written into the outbox, see `payload`)."""
        server, a, b = self.buckets[k]
        box = self.outbox[k]
        box[:PUSH_HEADER] = torch.tensor([kind, clock, self.pulled[k], self.weight, k])
        if self.hyper is not None:
            box[PUSH_HEADER:self.head] = self.hyper
        head = self.head
        if kind & GRADIENT and self.codecs is not None:
            encoder = self.codecs.pushes[k]
            with self.ctx.spans("compress"):
                encoder.encode(values[a:b], box[head:head + encoder.words])
        elif kind & GRADIENT and values is not None:  # None: the gradient is in place
            box[head:head + b - a] = values[a:b]
        self.sends[k] = self.ctx.transport.isend(box, self.ctx.topology.server_ranks[server])
        if self.first_sent is None:
            self.first_sent = self.ctx.now()

    def payload(self, k: int) -> torch.Tensor:
        """Where bucket k's uncompressed gradient goes in its outbox."""
        _, a, b = self.buckets[k]
        return self.outbox[k][self.head:self.head + b - a]

    def send_all(self, kind: int, clock: int, values: torch.Tensor | None = None) -> None:
        for k in range(len(self.buckets)):
            self.send(k, kind, clock, values)

    def wait_sends(self) -> None:
        for work in self.sends:
            work.wait()
        self.sends = [None] * len(self.buckets)

    def wait_replies(self, into: torch.Tensor) -> None:
        """Wait for every bucket's reply (span "wait": blocked on the servers) and write its
        parameters into `into`, the model's buffer (span "pull"; a reply received in place
        is there already)."""
        with self.ctx.spans("wait"):
            for work in self.receives:
                work.wait()
        with self.ctx.spans("pull"):
            progress = []
            for k, (_, a, b) in enumerate(self.buckets):
                version, over, applied = self.inbox[k][:REPLY_HEADER].tolist()
                self.pulled[k] = int(version)
                self.over |= bool(over)
                progress.append(applied)
                if self.codecs is not None and self.codecs.replies is not None:
                    with self.ctx.spans("compress"):
                        into[a:b] = self.codecs.replies[k].apply(self.inbox[k][REPLY_HEADER:])
                elif not self.in_place:
                    into[a:b] = self.inbox[k][REPLY_HEADER:]
            self.progress = min(progress)

    def start_at(self, version: int, values: torch.Tensor) -> None:
        """The servers start at `version`, a global batch each, from the parameters `values`
        (they took over a synchronous phase's state)."""
        self.pulled = [version] * len(self.buckets)
        self.progress = float(version)
        if self.codecs is not None:
            self.codecs.restart(values)

    def leave(self) -> None:
        """Tell every server this worker is done."""
        self.send_all(DONE, clock=0)
        self.wait_sends()

    def state_dict(self) -> dict:
        """The server version each bucket was last pulled at, whether training is over and
        the progress last heard of; the codecs' residuals and copies."""
        return {"pulled": list(self.pulled), "over": self.over, "progress": self.progress,
                "codecs": self.codecs.state_dict() if self.codecs else None}

    def load_state_dict(self, state: dict) -> None:
        self.pulled, self.over = list(state["pulled"]), state["over"]
        if len(self.pulled) != len(self.buckets):  # resumed with another server layout
            self.pulled = [max(self.pulled)] * len(self.buckets)
        self.progress = state["progress"]
        if self.codecs is not None and state.get("codecs") is not None:
            self.codecs.load_state_dict(state["codecs"])


class ParameterServerWorker(Strategy):
    """Push gradient buckets to their servers as backward produces them; pull them back.

    When to push and when to fetch is the `PushFetch` cadence (strategies/cadence.py): every
    step by default; Downpour's `push_every` / `fetch_every` (Dean et al., "Large Scale
    Distributed Deep Networks", NIPS 2012) let gradients accumulate locally between pushes,
    and between fetches the worker steps its own replica with plain SGD on its own gradient,
    so the steps in between are not computed on the same parameters again.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        flat, s = self.flat, self.settings
        self.link = ServerLink(self.ctx, flat, self.batch_weight, replies_are_the_model=True)
        self.cadence = PushFetch(s.get("push_every", 1), s.get("fetch_every", 1))
        self.local_sgd = self.cadence.fetch.every > 1
        self.grad = torch.zeros(len(flat))  # gradients since the last push
        # Which buckets each parameter feeds, and how many parameters each bucket waits for.
        buckets = self.link.buckets
        self.feeds = [[k for k, (_, a, b) in enumerate(buckets) if a < stop and start < b]
                      for start, stop in flat.ranges]
        self.needs = [sum(k in f for f in self.feeds) for k in range(len(buckets))]
        # Pushing every step, uncompressed: backward writes each gradient straight into its
        # buckets' outboxes (`pieces`: per parameter, (outbox slice, gradient slice)), with no
        # buffer to add into, copy out of and zero on the step's critical path.
        self.direct = self.cadence.push.every == 1 and self.link.codecs is None
        self.pieces = [[(self.link.payload(k)[max(a, start) - a:min(b, stop) - a],
                         slice(max(a, start) - start, min(b, stop) - start))
                        for k in self.feeds[i] for _, a, b in [buckets[k]]]
                       for i, (start, stop) in enumerate(flat.ranges)]
        self.fed = [False] * len(flat.params)  # which parameters' gradients this step has
        self.missing: list[int] = []
        self.collecting = self.pushing = self.fetching = False
        for i, p in enumerate(flat.params):
            p.register_post_accumulate_grad_hook(partial(self._on_grad, i))

    def begin_step(self, epoch: int) -> None:
        if self.hyper is not None:  # exact: each a float64 in two words
            self.link.hyper = torch.tensor(self.hyper, dtype=torch.float64).view(torch.float32)
        self.pushing, self.fetching = self.cadence.step()
        self.missing = list(self.needs) if self.pushing else []
        self.fed = [False] * len(self.fed)
        if self.fetching:
            self.link.expect_replies()
        self.collecting = True

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        if not self.collecting:
            return  # a backward outside a training step (not ours to push)
        grad = param.grad.reshape(-1)
        if self.direct:
            for box, part in self.pieces[index]:
                box.copy_(grad[part])
            self.fed[index] = True
        else:
            start, stop = self.flat.ranges[index]
            self.grad[start:stop] += grad
        if not self.pushing:
            return
        for k in self.feeds[index]:
            self.missing[k] -= 1
            if self.missing[k] == 0:
                self._push(k)

    def gradients_ready(self) -> None:
        for i, p in enumerate(self.flat.params):
            if p.grad is not None:
                self._on_grad(i, p)

    def reduce_gradients(self) -> None:
        """bsp's mean gradient, summed among the workers now: each pushes it (at its batch
        weight, so the servers' weighted sum is that mean)."""
        grad = self.flat.grad().mul_(self.batch_weight)
        with self.ctx.spans("wait"):
            self.ctx.transport.all_reduce(grad, WORKERS)
        into_model(self.flat, grad)

    def _push(self, k: int) -> None:
        self.link.send(k, PUSH if self.fetching else GRADIENT, self.cadence.pushes,
                       None if self.direct else self.grad)

    def step(self, epoch: int) -> None:
        self.collecting = False
        link = self.link
        with self.ctx.spans("push"):
            if self.pushing:
                if self.direct and not all(self.fed):  # no gradient: zeros, as accumulated
                    for i in (i for i, fed in enumerate(self.fed) if not fed):
                        for box, _ in self.pieces[i]:
                            box.zero_()
                for k, work in enumerate(link.sends):
                    if work is None:  # parameters that got no gradient
                        self._push(k)
            elif self.fetching:
                link.send_all(FETCH, self.cadence.pushes)
            if self.pushing or self.fetching:
                link.wait_sends()
            if self.pushing and not self.direct:
                self.grad.zero_()
        if self.fetching:
            link.wait_replies(self.flat.data)
        else:  # Downpour between fetches: step the local replica
            with self.ctx.spans("apply"):
                self._local_sgd(epoch)

    def _local_sgd(self, epoch: int) -> None:
        """A plain SGD step of the replica on this step's gradient: at each parameter's rate
        in a script (its group's lr, its scheduler's), else at the run's schedule's."""
        grad = self.flat.grad()
        rates = self.rates or [lr_at(self.ctx.config.optimizer, epoch)]
        if len(set(rates)) == 1:  # one rate: one pass over the whole model
            self.flat.data.add_(grad, alpha=-rates[0])
            return
        for (a, b), lr in zip(self.flat.ranges, rates, strict=True):
            self.flat.data[a:b].add_(grad[a:b], alpha=-lr)

    @property
    def stopped(self) -> bool:
        return self.link.over

    @property
    def progress(self) -> float:
        return self.link.progress

    def finish(self) -> None:
        if self.cadence.final_push():  # Downpour: gradients of the last steps, not pushed
            self.link.send_all(GRADIENT, self.cadence.pushes, self.grad)
            self.link.wait_sends()
        self.link.leave()

    def state_dict(self) -> dict:
        return {"cadence": self.cadence.state_dict(), "link": self.link.state_dict(),
                "accumulated": self.grad.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.cadence.load_state_dict(state["cadence"])
        self.link.load_state_dict(state["link"])
        self.grad.copy_(state["accumulated"])
