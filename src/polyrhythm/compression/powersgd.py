"""PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression
for Distributed Optimization", NeurIPS 2019): each matrix M of an extent (whole rows of a
parameter of two or more dimensions, wire.extent_of) travels as rank-r factors from one power
iteration, P = orth(M Q), then Q = Mᵀ P, and is decoded as P Qᵀ; Q starts the next step's
iteration (warm start). Matrices the factors would not shrink to half, and every value outside
a matrix (biases, a bucket's ragged rows), travel as they are, as PyTorch's PowerSGD hook does.

A message is [plain values | every P | every Q]. In an all-reduce (comm/compressed.py) the
first two parts are one all-reduce and the Qs a second, computed from the summed Ps: every
worker then holds the same factors, so their Qs stay alike for the warm start.
"""

from __future__ import annotations

import torch

from polyrhythm.compression.codecs import Codec
from polyrhythm.compression.wire import compressed_matrices, lowrank_sizes

# Gram-Schmidt's guard: a column of (nearly) zeros stays zero instead of dividing by zero.
EPSILON = 1e-8


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """The columns of `p` made orthonormal in place, left to right (Gram-Schmidt, as the
    PowerSGD hook does: the same operations in the same order on every worker)."""
    for i in range(p.shape[1]):
        column = p[:, i:i + 1]
        column.div_(column.norm() + EPSILON)
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest.sub_(column @ (column.T @ rest))
    return p


class PowerSGD(Codec):
    """Rank-r factors of each matrix; warm-started Qs are the codec's state."""

    name = "powersgd"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.rank, self.warm = self.settings["rank"], self.settings["warm_start"]
        self.chosen = compressed_matrices(self.extent, self.rank)
        self.plain, self.p_size, self.q_size = lowrank_sizes(self.extent, self.rank)
        # The values outside the chosen matrices, as index ranges of the extent.
        self.ranges, start = [], 0
        for m, _ in sorted(self.chosen, key=lambda c: c[0].start):
            if m.start > start:
                self.ranges.append((start, m.start))
            start = m.start + m.numel
        if self.numel > start:
            self.ranges.append((start, self.numel))
        self.qs = [self._fresh(m.cols, r) for m, r in self.chosen]

    def _fresh(self, cols: int, r: int) -> torch.Tensor:
        return torch.randn(cols, r, generator=self.generator)

    def matrices(self, values: torch.Tensor) -> list[torch.Tensor]:
        """The chosen matrices of `values`, as views."""
        return [values[m.start:m.start + m.numel].view(m.rows, m.cols) for m, _ in self.chosen]

    def plain_values(self, values: torch.Tensor, out: torch.Tensor) -> None:
        offset = 0
        for a, b in self.ranges:
            out[offset:offset + b - a] = values[a:b]
            offset += b - a

    def put_plain(self, plain: torch.Tensor, out: torch.Tensor) -> None:
        offset = 0
        for a, b in self.ranges:
            out[a:b] = plain[offset:offset + b - a]
            offset += b - a

    def project(self, values: torch.Tensor, ps: torch.Tensor) -> None:
        """The first half of the power iteration: each P = M Q, into `ps`."""
        offset = 0
        for matrix, q, (m, r) in zip(self.matrices(values), self.qs, self.chosen, strict=True):
            ps[offset:offset + m.rows * r].view(m.rows, r).copy_(matrix @ q)
            offset += m.rows * r

    def back(self, values: torch.Tensor, ps: torch.Tensor, qs: torch.Tensor) -> None:
        """The second half: each P made orthonormal in `ps`, then Q = Mᵀ P into `qs`."""
        p_at = q_at = 0
        for matrix, (m, r) in zip(self.matrices(values), self.chosen, strict=True):
            p = orthonormalise(ps[p_at:p_at + m.rows * r].view(m.rows, r))
            qs[q_at:q_at + m.cols * r].view(m.cols, r).copy_(matrix.T @ p)
            p_at, q_at = p_at + m.rows * r, q_at + m.cols * r

    def keep(self, qs: torch.Tensor) -> None:
        """The Qs the next iteration starts from: these (warm start), or fresh ones."""
        offset = 0
        for i, (m, r) in enumerate(self.chosen):
            if self.warm:
                self.qs[i].copy_(qs[offset:offset + m.cols * r].view(m.cols, r))
            else:
                self.qs[i] = self._fresh(m.cols, r)
            offset += m.cols * r

    def unfold(self, plain: torch.Tensor, ps: torch.Tensor, qs: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """The dense values of a message's parts, into `out`."""
        self.put_plain(plain, out)
        p_at = q_at = 0
        for m, r in self.chosen:
            p = ps[p_at:p_at + m.rows * r].view(m.rows, r)
            q = qs[q_at:q_at + m.cols * r].view(m.cols, r)
            out[m.start:m.start + m.numel].view(m.rows, m.cols).copy_(p @ q.T)
            p_at, q_at = p_at + m.rows * r, q_at + m.cols * r
        return out

    def parts(self, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A message's plain values, Ps and Qs (views)."""
        return payload.split([self.plain, self.p_size, self.q_size])

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        plain, ps, qs = self.parts(out)
        self.plain_values(values, plain)
        self.project(values, ps)
        self.back(values, ps, qs)
        self.keep(qs)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return self.unfold(*self.parts(payload), out)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "qs": [q.clone() for q in self.qs]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for q, kept in zip(self.qs, state["qs"], strict=True):
            q.copy_(kept)
