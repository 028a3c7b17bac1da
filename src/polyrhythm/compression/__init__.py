"""Compressors: fewer bytes on the wire for gradients, replies and model exchanges.

A compressor is declared like a strategy: its settings next to its code, its wire format
(wire.py: its messages' sizes, how an all-reduce carries them), one
`COMPRESSORS.register(...)` line here. The declarations and the size arithmetic (wire.py)
import no torch, so listing them, checking a config and simulating a run load none; the
codecs that encode and decode (codecs.py, powersgd.py) and the error feedback around them
(feedback.py) are loaded when a run builds them. Which messages they compress, and how an
all-reduce carries them, is for the transport's users: strategies/ps_worker.py and
runtime/server/server.py (pushes and replies), comm/compressed.py (all-reduce),
strategies/averaging.py (model exchanges).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyrhythm.compression.wire import (
    DENSE,
    HALF,
    LOW_RANK,
    QSGD_LEVELS,
    RANDOM_K,
    SIGNS,
    TOP_K,
    WireFormat,
)
from polyrhythm.limits import MAX_QSGD_LEVELS
from polyrhythm.settings import Component, Param, Registry, at_least, load_object, within


@dataclass(frozen=True)
class CompressorSpec(Component):
    """A registered compressor: its codec ("package.module:Class", built as
    `codec(settings, extent, seed)`), its wire format (wire.py) and whether it is biased
    (its error feedback is then on unless turned off)."""

    codec: str | Callable[..., Any] = ""
    biased: bool = False
    # Its messages' sizes and how an all-reduce carries them (wire.py), torch-free: what the
    # codec lays its messages out by and the simulator sizes them with.
    wire: WireFormat = DENSE
    # Among the compressors `polyrhythm advise` pairs with each option unless told.
    advised: bool = False

    @property
    def compresses(self) -> bool:
        return self.name != NONE

    def build(self, settings: Any, extent: Any, seed: int) -> Any:
        """A codec of this compressor for the values of `extent` (compression/wire.py)."""
        return load_object(self.codec)(settings, extent, seed)

    def error_feedback(self, settings: Any) -> bool:
        """Whether a sender keeps what it did not send and adds it to its next message."""
        given = settings.get("error_feedback")
        return self.biased if given is None else given


NONE = "none"
CODECS = "polyrhythm.compression.codecs"

RATIO = Param("ratio", float, "share of the values sent (top-k: the largest magnitudes; "
              "random-k: drawn at random)", 0.01, rule=within(0, 1, low_open=True))

# Read by every compressor (a Kind's shared parameters, config/__init__.py).
SHARED = (
    Param("error_feedback", bool, "keep what a message did not carry and add it to the next "
          "(error feedback)", derived="on for the biased ones: topk, signsgd, powersgd"),
    Param("compress_replies", bool, "parameter servers: compress their replies too, each "
          "worker's change since its last reply, the rest kept on the server "
          "(DoubleSqueeze)", False),
)

COMPRESSORS: Registry[CompressorSpec] = Registry("compressor")
COMPRESSORS.register(CompressorSpec(
    NONE, "dense float32, as without compression", codec=f"{CODECS}:Dense", advised=True))
COMPRESSORS.register(CompressorSpec(
    "fp16", "half precision (IEEE binary16) on the wire: 2 bytes a value",
    source="Horovod's and DDP's fp16 compression", codec=f"{CODECS}:Half", wire=HALF,
    advised=True))
COMPRESSORS.register(CompressorSpec(
    "bf16", "bfloat16 on the wire: 2 bytes a value, float32's range",
    source="DDP's bf16 compression hook", codec=f"{CODECS}:BHalf", wire=HALF))
COMPRESSORS.register(CompressorSpec(
    "topk", "the k largest magnitudes as (int32 index, value) pairs",
    source="Deep Gradient Compression, Lin et al., ICLR 2018; GRACE, Xu et al. 2021",
    params=(RATIO,), codec=f"{CODECS}:TopK", wire=TOP_K, biased=True, advised=True))
COMPRESSORS.register(CompressorSpec(
    "randomk", "k values at random indices, scaled by numel/k (unbiased)",
    source="Stich et al., NeurIPS 2018; GRACE, Xu et al. 2021", params=(RATIO,),
    codec=f"{CODECS}:RandomK", wire=RANDOM_K))
COMPRESSORS.register(CompressorSpec(
    "signsgd", "one bit a value (its sign) and a mean magnitude per 512 values",
    source="signSGD, Bernstein et al., ICML 2018; EF-SignSGD, Karimireddy et al., ICML 2019",
    codec=f"{CODECS}:SignSGD", wire=SIGNS, biased=True))
COMPRESSORS.register(CompressorSpec(
    "qsgd", "s levels per 512-value chunk's norm, stochastic rounding (unbiased)",
    source="QSGD, Alistarh et al., NeurIPS 2017", params=(
        Param("levels", int, "quantisation levels s (1 + bits of s per value)", 15,
              rule=at_least(1, MAX_QSGD_LEVELS)),), codec=f"{CODECS}:QSGD",
    wire=QSGD_LEVELS, advised=True))
COMPRESSORS.register(CompressorSpec(
    "powersgd", "each matrix as rank-r factors P and Q by one power iteration",
    source="PowerSGD, Vogels, Karimireddy and Jaggi, NeurIPS 2019", params=(
        Param("rank", int, "rank r of the low-rank approximation", 4, rule=at_least(1)),
        Param("warm_start", bool, "start each power iteration from the last step's Q", True)),
    codec="polyrhythm.compression.powersgd:PowerSGD", wire=LOW_RANK, biased=True,
    advised=True))

__all__ = ["COMPRESSORS", "NONE", "SHARED", "CompressorSpec"]
