"""The codecs: each encodes the values of one extent (compression/wire.py) into a message of
float32 words and decodes it back to dense values, laid out as wire.payload_words sizes it.

`encode(values, out)` writes the message into `out` (its words); `decode(payload, out)`
overwrites `out` with the dense values and returns it. A codec whose messages add up as they
are (`reduce` SUM: half precision, random-k at indices every worker draws alike) also has
`summand(values)`, what an all-reduce sums, and `expand(summed, out)`. Random draws (random-k's
indices, QSGD's rounding) come from the codec's own generator, seeded by the caller: alike on
every worker where an all-reduce needs the same draws, apart where messages are independent.
Every codec's state (its generator, PowerSGD's factors) is in `state_dict`.
"""

from __future__ import annotations

import numpy as np
import torch

from polyrhythm.compression.wire import (
    CHUNK,
    Extent,
    chunks,
    kept,
    payload_words,
    qsgd_bits,
    wire_format,
)


class Codec:
    """One compressor's encoding of `extent`'s values (`settings`: the run's [compression])."""

    name = "none"

    def __init__(self, settings, extent: Extent, seed: int) -> None:
        self.settings, self.extent, self.numel = settings, extent, extent.numel
        self.words = payload_words(self.name, settings, extent)
        self.reduce = wire_format(self.name).reduce  # how an all-reduce carries it
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def summand(self, values: torch.Tensor) -> torch.Tensor:
        """(SUM codecs) What an all-reduce of these values sums: a tensor of its own."""
        raise NotImplementedError

    def expand(self, summed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """(SUM codecs) The dense values of an all-reduced summand, into `out`."""
        raise NotImplementedError

    def draw_seed(self) -> int:
        return int(torch.randint(2**31 - 1, (1,), generator=self.generator))

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class Dense(Codec):
    """No compression: the float32 values as they are (the run without a compressor)."""


    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(values)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(payload)

    def summand(self, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    def expand(self, summed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(summed)


class Half(Codec):
    """IEEE half precision: two values a word (round to nearest even; beyond ±65504, inf)."""

    name = "fp16"
    dtype = torch.float16

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        halves = out.view(self.dtype)
        halves[:self.numel] = values
        halves[self.numel:] = 0  # the odd half of the last word

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(payload.view(self.dtype)[:self.numel])

    def summand(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(self.dtype)

    def expand(self, summed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(summed)


class BHalf(Half):
    """bfloat16: float32's exponent, 8 bits of mantissa."""

    name = "bf16"
    dtype = torch.bfloat16


class TopK(Codec):
    """The k largest magnitudes: k int32 indices, then their k values."""

    name = "topk"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.k = kept(self.settings["ratio"], self.numel)

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        index = values.abs().topk(self.k, sorted=False).indices
        out[:self.k].view(torch.int32).copy_(index)
        torch.index_select(values, 0, index, out=out[self.k:])

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        index = payload[:self.k].view(torch.int32).long()
        out.zero_()
        return out.index_put_((index,), payload[self.k:2 * self.k])


class RandomK(Codec):
    """k values at indices drawn without replacement, scaled by numel/k when decoded, so the
    decoded message's expectation is the values (unbiased). A message starts with the seed
    its indices are drawn from; in an all-reduce every worker draws the same (their
    generators are seeded alike), so only the values travel and they add up."""

    name = "randomk"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.k = kept(self.settings["ratio"], self.numel)
        self.scale = self.numel / self.k if self.k else 0.0
        self._index: torch.Tensor | None = None  # the last summand's

    def _indices(self, seed: int) -> torch.Tensor:
        draw = torch.Generator().manual_seed(seed)
        return torch.randperm(self.numel, generator=draw)[:self.k]

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        if not self.numel:
            return
        seed = self.draw_seed()
        out[:1].view(torch.int32).fill_(seed)
        torch.index_select(values, 0, self._indices(seed), out=out[1:])

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        if not self.numel:
            return out
        seed = int(payload[:1].view(torch.int32))
        return out.index_put_((self._indices(seed),), payload[1:] * self.scale)

    def summand(self, values: torch.Tensor) -> torch.Tensor:
        self._index = self._indices(self.draw_seed())
        return values[self._index]

    def expand(self, summed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        return out.index_put_((self._index,), summed * self.scale)


class _Chunked(Codec):
    """Codes of a few bits per value and one float32 scale per CHUNK values: the scales
    first, then the codes packed little-endian into the following words."""

    bits = 1

    def _chunked(self, values: torch.Tensor) -> torch.Tensor:
        """The values as rows of CHUNK, zeros after the last."""
        padded = torch.zeros(chunks(self.numel) * CHUNK)
        padded[:self.numel] = values
        return padded.view(-1, CHUNK)

    def _put(self, scales: torch.Tensor, codes: torch.Tensor, out: torch.Tensor) -> None:
        count = chunks(self.numel)
        out[:count] = scales
        packed = out[count:].view(torch.uint8)
        packed.zero_()
        data = pack(codes, self.bits)
        packed[:data.numel()] = data

    def _get(self, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scales, and the codes as rows of CHUNK."""
        count = chunks(self.numel)
        codes = unpack(payload[count:].view(torch.uint8), self.bits, self.numel)
        padded = torch.zeros(count * CHUNK, dtype=torch.int32)
        padded[:self.numel] = codes
        return payload[:count], padded.view(-1, CHUNK)


class SignSGD(_Chunked):
    """Each value's sign in one bit (zero reads as +), times its chunk's mean magnitude
    (scaled sign, as EF-SignSGD)."""

    name = "signsgd"

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        rows = self._chunked(values)
        sizes = torch.full((rows.shape[0],), float(CHUNK))
        sizes[-1] = self.numel - CHUNK * (rows.shape[0] - 1)
        self._put(rows.abs().sum(1) / sizes, (values < 0).to(torch.int32), out)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        scales, negative = self._get(payload)
        signs = 1.0 - 2.0 * negative.float()
        return out.copy_((signs * scales.unsqueeze(1)).view(-1)[:self.numel])


class QSGD(_Chunked):
    """QSGD: each value as its sign and a level l in 0..s of its chunk's norm, rounded up
    with probability |v|/norm·s − l, so that the expectation is the value (unbiased)."""

    name = "qsgd"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.levels = self.settings["levels"]
        self.bits = qsgd_bits(self.levels)

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        rows = self._chunked(values)
        norms = rows.norm(dim=1)
        share = rows.abs() / torch.where(norms > 0, norms, 1.0).unsqueeze(1) * self.levels
        low = share.floor()
        up = torch.rand(share.shape, generator=self.generator) < (share - low)
        level = (low + up).clamp_(max=self.levels).to(torch.int32).view(-1)[:self.numel]
        sign = (values < 0).to(torch.int32) << (self.bits - 1)
        self._put(norms, sign | level, out)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        norms, codes = self._get(payload)
        level = (codes & ((1 << (self.bits - 1)) - 1)).float()
        signs = 1.0 - 2.0 * (codes >> (self.bits - 1)).float()
        values = signs * level * (norms / self.levels).unsqueeze(1)
        return out.copy_(values.view(-1)[:self.numel])


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes of `bits` bits each as bytes, little-endian: code i's bit j is bit
    i·bits + j of the stream (numpy's packbits: four times torch's shifts and sums here)."""
    stream = ((codes.unsqueeze(1) >> torch.arange(bits, dtype=torch.int32)) & 1).to(torch.uint8)
    return torch.from_numpy(np.packbits(stream.numpy().reshape(-1), bitorder="little"))


def unpack(data: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """`count` codes of `bits` bits from bytes that `pack` wrote (int32)."""
    stream = np.unpackbits(data.numpy(), count=count * bits, bitorder="little")
    stream = torch.from_numpy(stream).view(count, bits).to(torch.int32)
    return (stream << torch.arange(bits, dtype=torch.int32)).sum(1, dtype=torch.int32)
