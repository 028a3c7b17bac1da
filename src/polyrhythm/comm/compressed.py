"""All-reduce with compressed messages: how each kind of codec (compression/wire.py) crosses a
collective, over the transport's all-reduce and all-gather of any algorithm (Gloo's own,
ring, tree, reduce-broadcast), so every byte is counted where every other is.

- SUM (fp16, bf16, random-k): the codec's summand (half precision; random-k's values at the
  indices every worker draws alike) is all-reduced as it is, and expanded back;
- GATHER (top-k, signSGD, QSGD): every worker's message is all-gathered; each decodes every
  message and adds them in worker order, so all end with the same bits;
- LOWRANK (PowerSGD): the plain values and the P factors in one all-reduce, the Q factors,
  computed from the summed and orthonormalised Ps, in a second (Vogels et al., Algorithm 1).

Error feedback keeps, on each worker, what its contribution lost: its values minus what its
own message decodes to (SUM, GATHER); for PowerSGD, as in the paper and PyTorch's hook, its
values minus its share of the decoded sum, so that the workers' residuals add up to what the
sum lost (plain values, sent exactly, keep none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from polyrhythm.comm.transport import NATIVE, WORKERS, Transport
from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression.wire import GATHER, LOWRANK, SUM, codec_seed, extent_of

COLLECTIVE = 3  # codec_seed's role


class CompressedAllReduce:
    """Sums one flat tensor of `numel` values (a model's, of parameters of `shapes`) over a
    group, compressed. `share`: this member's weight in the sum (its batch share), which
    PowerSGD's error feedback reads; `worker` and `seed` seed the codec's draws (alike on
    every worker where the summands must add up); `spans(name)` times its phases."""

    def __init__(self, transport: Transport, settings, shapes: Sequence[Sequence[int]],
                 numel: int, share: float, worker: int, seed: int,
                 spans: Callable[[str], AbstractContextManager],
                 group: str = WORKERS, algorithm: str = NATIVE) -> None:
        spec = COMPRESSORS[settings.name]
        self.transport, self.group, self.algorithm = transport, group, algorithm
        self.share, self.spans = share, spans
        extent = extent_of(0, numel, shapes)
        # Summands and PowerSGD's first Qs must be drawn alike everywhere; a gathered
        # codec's draws (QSGD's rounding) are independent between workers.
        alike = spec.wire.reduce in (SUM, LOWRANK)
        self.codec = spec.build(settings, extent, codec_seed(seed, COLLECTIVE,
                                                             0 if alike else worker + 1))
        self.residual = torch.zeros(numel) if spec.error_feedback(settings) else None
        self._decoded = torch.empty(numel)

    def __call__(self, tensor: torch.Tensor) -> None:
        """tensor <- the decoded sum over the group of every member's tensor, in place."""
        with self.spans("compress"):
            given = tensor if self.residual is None else tensor + self.residual
        {SUM: self._sum, GATHER: self._gather, LOWRANK: self._lowrank}[self.codec.reduce](
            given, tensor)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        with self.spans("wait"):
            self.transport.all_reduce(tensor, self.group, self.algorithm)

    def _keep(self, lost: torch.Tensor) -> None:
        if self.residual is not None:
            self.residual.copy_(lost)

    def _sum(self, given: torch.Tensor, out: torch.Tensor) -> None:
        codec = self.codec
        with self.spans("compress"):
            summand = codec.summand(given)
            if self.residual is not None:
                self._keep(given - codec.expand(summand, self._decoded))
        self._all_reduce(summand)
        with self.spans("compress"):
            codec.expand(summand, out)

    def _gather(self, given: torch.Tensor, out: torch.Tensor) -> None:
        codec = self.codec
        with self.spans("compress"):
            message = torch.empty(codec.words)
            codec.encode(given, message)
            if self.residual is not None:
                self._keep(given - codec.decode(message, self._decoded))
        with self.spans("wait"):
            messages = self.transport.all_gather(message, self.group, self.algorithm)
        with self.spans("compress"):
            out.zero_()
            for row in messages:
                out.add_(codec.decode(row, self._decoded))

    def _lowrank(self, given: torch.Tensor, out: torch.Tensor) -> None:
        codec = self.codec
        with self.spans("compress"):
            first = torch.empty(codec.plain + codec.p_size)
            plain, ps = first.split([codec.plain, codec.p_size])
            codec.plain_values(given, plain)
            codec.project(given, ps)
        self._all_reduce(first)
        with self.spans("compress"):
            qs = torch.empty(codec.q_size)
            codec.back(given, ps, qs)
        if codec.q_size:
            self._all_reduce(qs)
        with self.spans("compress"):
            codec.keep(qs)
            codec.unfold(plain, ps, qs, out)
            if self.residual is not None:
                lost = given - self.share * out
                codec.put_plain(torch.zeros(codec.plain), lost)
                self._keep(lost)

    def state_dict(self) -> dict:
        return {"codec": self.codec.state_dict(),
                "residual": None if self.residual is None else self.residual.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state["codec"])
        if self.residual is not None and state["residual"] is not None:
            self.residual.copy_(state["residual"])
