"""How big a compressed message is, as pure arithmetic (no torch). The codecs
(compression/codecs.py, powersgd.py) lay their messages out by these functions, and the
simulator sizes its messages with them, so both move the same bytes.

A message is float32 words (4 bytes each): an index travels as the 32 bits of an int32, a
half-precision value as half a word, a sign as a bit; a payload is rounded up to whole words.
The values one codec encodes are an `Extent`: a range of the flat model, with the matrices in
it (a parameter of two or more dimensions, viewed as rows by everything else, as PyTorch's
PowerSGD hook views it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

WORD = 4  # bytes: a message is float32 words
CHUNK = 512  # values sharing one scale (signsgd's mean magnitude, qsgd's norm), as QSGD's buckets
# PowerSGD compresses a matrix only where its factors take less than half its size, as the
# PowerSGD hook's min_compression_rate does by default.
MIN_COMPRESSION_RATE = 2


class Matrix(NamedTuple):
    """Whole rows of one parameter inside an extent: `rows` x `cols` values from `start`
    (an offset into the extent), row-major."""

    start: int
    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


class Extent(NamedTuple):
    """The values one codec encodes: `numel` of them, with the `matrices` among them."""

    numel: int
    matrices: tuple[Matrix, ...] = ()


def extent_of(start: int, stop: int, shapes: Sequence[Sequence[int]] = ()) -> Extent:
    """The extent of [start, stop) of a flat model whose parameters have `shapes`, in flat
    order: the whole rows of each parameter of two or more dimensions that fall in the range
    (a bucket may cut a parameter; its ragged rows are plain values). No shapes: no
    matrices."""
    matrices, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        if len(shape) >= 2 and n:
            cols = n // shape[0]
            low, high = max(start, offset), min(stop, offset + n)
            first, last = -(-(low - offset) // cols), (high - offset) // cols
            if last > first:
                matrices.append(Matrix(offset + first * cols - start, last - first, cols))
        offset += n
    return Extent(stop - start, tuple(matrices))


def words(nbytes: int) -> int:
    """Float32 words that hold `nbytes` bytes."""
    return -(-nbytes // WORD)


def chunks(numel: int) -> int:
    """Scales a chunked codec sends: one per CHUNK values."""
    return -(-numel // CHUNK)


def kept(ratio: float, numel: int) -> int:
    """Values top-k and random-k send of `numel`: the ratio's share, rounded, at least one
    (none of none)."""
    return min(numel, max(1, round(ratio * numel))) if numel else 0


def qsgd_bits(levels: int) -> int:
    """Bits of one QSGD value: its sign and a level in 0..s."""
    return 1 + levels.bit_length()


def compressed_matrices(extent: Extent, rank: int) -> list[tuple[Matrix, int]]:
    """The matrices PowerSGD compresses, each with its rank (at most its smaller side):
    those whose factors take less than 1/MIN_COMPRESSION_RATE of it."""
    out = []
    for m in extent.matrices:
        r = min(rank, m.rows, m.cols)
        if (m.rows + m.cols) * r * MIN_COMPRESSION_RATE < m.numel:
            out.append((m, r))
    return out


def lowrank_sizes(extent: Extent, rank: int) -> tuple[int, int, int]:
    """PowerSGD's message in values: (plain values, the P factors', the Q factors')."""
    chosen = compressed_matrices(extent, rank)
    plain = extent.numel - sum(m.numel for m, _ in chosen)
    return plain, sum(m.rows * r for m, r in chosen), sum(m.cols * r for m, r in chosen)


# How an all-reduce carries a compressor's messages:
# - SUM: the encoded values add up as they are (half precision; random-k's values at indices
#   every worker draws alike): one all-reduce of them;
# - GATHER: each worker's message is gathered by all (top-k's pairs, signs, levels), which
#   decode and add them in worker order;
# - LOWRANK: PowerSGD's two all-reduces, of the P factors (with the plain values), then of Q.
SUM, GATHER, LOWRANK = "sum", "gather", "lowrank"

Size = Callable[[Mapping[str, Any], Extent], int]  # (the compressor's settings, an extent)


class WireFormat(NamedTuple):
    """A compressor's messages, as its declaration gives them (compression/__init__.py):
    `payload`, the words of a point-to-point message of an extent; `reduce`, how an
    all-reduce carries them; for SUM, `summed`, the values summed (the payload's by default)
    and `summand`, the bytes of one as the all-reduce moves it."""

    payload: Size
    reduce: str = GATHER
    summed: Size | None = None
    summand: int = WORD

    def all_reduce_parts(self, settings: Mapping[str, Any],
                         extent: Extent) -> list[tuple[str, int]]:
        """What an all-reduce of `extent`'s values moves: (SUM, bytes) for each all-reduce,
        or (GATHER, bytes of one worker's message) for the gather."""
        if self.reduce == LOWRANK:
            plain, p, q = lowrank_sizes(extent, settings["rank"])
            return [(SUM, WORD * (plain + p)), (SUM, WORD * q)]
        if self.reduce == SUM:
            summed = (self.summed or self.payload)(settings, extent)
            return [(SUM, self.summand * summed)]
        return [(GATHER, WORD * self.payload(settings, extent))]


def _randomk(settings: Mapping[str, Any], extent: Extent) -> int:
    """The values, and the seed that draws their indices."""
    return kept(settings["ratio"], extent.numel) + 1 if extent.numel else 0


# Each registered compressor's format (compression/__init__.py declares which).
DENSE = WireFormat(lambda s, e: e.numel, SUM)
HALF = WireFormat(lambda s, e: words(2 * e.numel), SUM, summed=lambda s, e: e.numel,
                  summand=2)
TOP_K = WireFormat(lambda s, e: 2 * kept(s["ratio"], e.numel))  # an int32 index, a value each
# Every worker draws the same indices: an all-reduce sums the values, and no seed travels.
RANDOM_K = WireFormat(_randomk, SUM, summed=lambda s, e: kept(s["ratio"], e.numel))
SIGNS = WireFormat(lambda s, e: chunks(e.numel) + words(-(-e.numel // 8)))  # scale, bits
QSGD_LEVELS = WireFormat(  # a norm per chunk, sign and level per value
    lambda s, e: chunks(e.numel) + words(-(-e.numel * qsgd_bits(s["levels"]) // 8)))
LOW_RANK = WireFormat(lambda s, e: sum(lowrank_sizes(e, s["rank"])), LOWRANK)


def wire_format(name: str) -> WireFormat:
    """The format of registered compressor `name`."""
    from polyrhythm.compression import COMPRESSORS  # which declares it (and imports this)

    return COMPRESSORS[name].wire


def payload_words(name: str, settings: Mapping[str, Any], extent: Extent) -> int:
    """Words of a point-to-point message of `extent`'s values under compressor `name`."""
    return wire_format(name).payload(settings, extent)


def all_reduce_parts(name: str, settings: Mapping[str, Any],
                     extent: Extent) -> list[tuple[str, int]]:
    """What an all-reduce of `extent`'s values under `name` moves (WireFormat)."""
    return wire_format(name).all_reduce_parts(settings, extent)


def summand_bytes(name: str) -> int:
    """Bytes of one value of a SUM codec's summand as an all-reduce moves it (half precision:
    two; random-k's values and dense ones: a word): what the simulator schedules a SUM part's
    all-reduce by, as the real one is scheduled by its tensor's values."""
    return wire_format(name).summand


def bucket_words(settings: Mapping[str, Any], buckets: Sequence[tuple[int, int, int]],
                 shapes: Sequence[Sequence[int]], replies: bool = False) -> list[int]:
    """Payload words of each parameter-server bucket's message, (server, start, stop) each:
    a push's, or with `replies` a reply's (dense where replies are not compressed)."""
    name = settings["name"] if not replies or settings.get("compress_replies") else "none"
    return [payload_words(name, settings, extent_of(a, b, shapes)) for _, a, b in buckets]


def wire_ratio(settings: Mapping[str, Any], shapes: Sequence[Sequence[int]]) -> float:
    """A compressor's message of a whole model of parameters of `shapes` over the dense one:
    the share of the bytes it sends."""
    extent = extent_of(0, sum(math.prod(s) for s in shapes), shapes)
    return payload_words(settings["name"], settings, extent) / max(1, extent.numel)


def codec_seed(seed: int, *where: int) -> int:
    """The seed of one codec's draws: the run's seed and where the codec sits (a role, a
    worker, a bucket), mixed into 31 bits, the same on every machine."""
    mixed = seed & 0x7FFFFFFF
    for part in where:
        mixed = (mixed * 1_000_003 + part + 1) % 2_147_483_647
    return mixed
