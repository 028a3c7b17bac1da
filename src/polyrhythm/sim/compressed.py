"""Compression in the simulator: the bytes of each message a compressed run sends, by the
arithmetic the runs lay their messages out with (compression/wire.py), and the seconds its
codecs take on a worker and on a server.

Messages. A parameter-server push is the push header and its bucket's encoded values, padded
to its server's largest push (a worker's outbox, strategies/ps_worker.py); a reply is the reply
header and the bucket's values, dense unless replies are compressed. An all-reduce is the
parts wire.all_reduce_parts gives: a SUM part is all-reduced by the strategy's schedule as a
tensor of its summand's values (two bytes each for half precision), a GATHER part (one
worker's message) is all-gathered by the same algorithm's gather schedule (layout.GATHERS;
Gloo's own, simulated as the ring like its all-reduce), PowerSGD's two parts one after the
other. Without parameter shapes (a model given by its megabytes) there are no matrices, so
PowerSGD sends every value as it is.

Seconds, not overlapped with anything: a worker's per step that exchanges (a push, an
all-reduce, local SGD's average), a server's per whole-model push it decodes. A stored run
measures them for its compressor (calibrate.py); otherwise they are estimated from one encode
and one decode of the whole model, timed on this machine (cli/sizing.py), as the runs use
them: a push encodes, with error feedback decodes its message too (the residual), with
compressed replies decodes the reply; a server decodes each push and, with compressed
replies, encodes and decodes each reply; an all-reduce encodes and decodes, and a gathered
one decodes every member's message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from polyrhythm.compression import COMPRESSORS, NONE
from polyrhythm.compression.wire import (
    GATHER,
    SUM,
    WORD,
    all_reduce_parts,
    bucket_words,
    extent_of,
    summand_bytes,
)

HEADER = 5 * WORD  # a push's header (comm/messages.py PUSH_HEADER)
REPLY_HEADER = 3 * WORD  # a reply's (REPLY_HEADER)


class Part(NamedTuple):
    """One collective of an all-reduce: an all-reduce of `values` values (SUM), or an
    all-gather of each member's message of `values` words (`gather`), `value_bytes` each."""

    gather: bool
    values: int
    value_bytes: int


class Seconds(NamedTuple):
    """A worker's seconds per push step and per all-reduce, a server's per whole-model
    push."""

    push: float = 0.0
    reduce: float = 0.0
    server: float = 0.0


def codec_key(name: str, values: Mapping[str, Any]) -> str:
    """A compressor with its settings as one label (`topk ratio=0.01`, `none`), read from a
    config's compression settings or a stored run's flat fields alike: what a measured time
    and a stored run's accuracy belong to. Error feedback and compressed replies are named
    only where they differ from the compressor's own default."""
    if name == NONE or name not in COMPRESSORS:
        return name
    spec = COMPRESSORS[name]
    words = [name, *(f"{p.name}={values.get(p.name, p.default)}" for p in spec.params)]
    if spec.error_feedback(values) != spec.biased:
        words.append(f"error_feedback={spec.error_feedback(values)}")
    if values.get("compress_replies"):
        words.append("compress_replies=True")
    return " ".join(words)


def settings_key(settings) -> str:
    """codec_key of a config's compression settings."""
    return codec_key(settings.name, settings)


def push_bytes(settings, buckets: Sequence[tuple[int, int, int]],
               shapes: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """The bytes of each bucket's push (the header and the encoded values, padded to its
    server's largest push) and of its reply; `buckets` are (server, start, stop)."""
    pushes = bucket_words(settings, buckets, shapes)
    replies = bucket_words(settings, buckets, shapes, replies=True)
    capacity: dict[int, int] = {}
    for (server, _, _), words in zip(buckets, pushes, strict=True):
        capacity[server] = max(capacity.get(server, 0), words)
    return ([HEADER + WORD * capacity[server] for server, _, _ in buckets],
            [REPLY_HEADER + WORD * words for words in replies])


def all_reduce_of(settings, numel: int, shapes: Sequence[Sequence[int]]) -> list[Part]:
    """The collectives an all-reduce of a model of `numel` values takes under `settings`;
    empty ones (PowerSGD's Qs with no matrix) left out, as the runs leave them out."""
    name = settings.name
    parts = []
    for kind, nbytes in all_reduce_parts(name, settings, extent_of(0, numel, shapes)):
        size = summand_bytes(name) if kind == SUM else WORD
        if nbytes:
            parts.append(Part(kind == GATHER, nbytes // size, size))
    return parts


def estimated(settings, encode_s: float, decode_s: float, members: int) -> Seconds:
    """The seconds of the module's rules, from one encode and one decode of the whole model
    (`members`: the workers of an all-reduce, each of whose messages a gather decodes)."""
    spec = COMPRESSORS[settings.name]
    if not spec.compresses:
        return Seconds()
    feedback, replies = spec.error_feedback(settings), bool(settings.compress_replies)
    gathered = any(kind == GATHER for kind, _ in all_reduce_parts(
        settings.name, settings, extent_of(0, 1)))
    return Seconds(push=encode_s + decode_s * (feedback + replies),
                   reduce=encode_s + decode_s * ((members if gathered else 1) + feedback),
                   server=decode_s + (encode_s + decode_s) * replies)


def seconds(config, costs) -> Seconds:
    """The compression seconds of a simulation of `config` with `costs` (setup.Costs): the
    ones measured by the run that calibrates it where its compressor is the config's (its
    mean per step taken on the steps that exchange: local SGD's every tau, Downpour's every
    push_every), else estimated from the codec timed here, else none."""
    settings = config.compression
    key = settings_key(settings)
    timed = costs.codec_s.get(key)
    out = estimated(settings, *timed, config.workers) if timed else Seconds()
    if key == costs.compressor and costs.compress_s is not None:
        every = config.strategy.get("tau", config.strategy.get("push_every", 1))
        out = out._replace(push=costs.compress_s * every, reduce=costs.compress_s * every)
    if key == costs.compressor and costs.server_compress_s is not None:
        out = out._replace(server=costs.server_compress_s)
    return out
