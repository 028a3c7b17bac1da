"""The codecs of parameter-server buckets (layout.BucketLayout: (server, start, stop) each), on
both sides of the wire, a codec per bucket, seeded by where it sits:

- a worker's `WorkerCodecs`: an `Encoder` per bucket for its pushes (with error feedback where
  the compressor's is on) and, with compressed replies, a `Copy` per bucket of what the
  server has sent it;
- a server bucket's `BucketCodecs`: a codec that decodes pushes (a decode is stateless) and,
  with compressed replies, a `ChangeSender` per worker, holding that worker's copy.

Both start their copies from the same parameters (the model every worker starts from, or a
Strategy-Switch's handover), so the copies stay equal message by message.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression.codecs import Codec
from polyrhythm.compression.feedback import ChangeSender, Copy, Encoder
from polyrhythm.compression.wire import codec_seed, extent_of

PUSHES, REPLIES = 1, 2  # codec_seed's roles


def codec(settings, start: int, stop: int, shapes: Sequence[Sequence[int]], seed: int) -> Codec:
    """The run's compressor's codec of the values [start, stop) of the flat model."""
    return COMPRESSORS[settings.name].build(settings, extent_of(start, stop, shapes), seed)


def compressing(settings) -> bool:
    return COMPRESSORS[settings.name].compresses


class WorkerCodecs:
    """One worker's codecs of its buckets' pushes and replies."""

    def __init__(self, settings, buckets: list[tuple[int, int, int]],
                 shapes: Sequence[Sequence[int]], initial: torch.Tensor, worker: int,
                 seed: int) -> None:
        feedback = COMPRESSORS[settings.name].error_feedback(settings)
        self.ranges = [(a, b) for _, a, b in buckets]
        self.pushes = [Encoder(codec(settings, a, b, shapes,
                                     codec_seed(seed, PUSHES, worker, k)), feedback)
                       for k, (a, b) in enumerate(self.ranges)]
        self.replies = None
        if settings.compress_replies:
            self.replies = [Copy(codec(settings, a, b, shapes, 0), initial[a:b])
                            for a, b in self.ranges]

    def restart(self, values: torch.Tensor) -> None:
        """The servers start from these parameters (a Strategy-Switch's handover)."""
        for copy, (a, b) in zip(self.replies or (), self.ranges, strict=False):
            copy.values.copy_(values[a:b])

    def state_dict(self) -> dict:
        """The residuals and the copies as flat vectors, and each codec's own state."""
        residuals = [e.residual for e in self.pushes]
        return {"residual": None if residuals[0] is None else torch.cat(residuals),
                "copy": None if self.replies is None
                else torch.cat([c.values for c in self.replies]),
                "ranges": list(self.ranges),
                "codecs": [e.codec.state_dict() for e in self.pushes]}

    def load_state_dict(self, state: dict) -> None:
        """Restore, re-sliced where the buckets are laid out anew (another server count:
        the codecs then start afresh, the residuals and copies carry on)."""
        same = [tuple(r) for r in state["ranges"]] == self.ranges
        for k, (encoder, (a, b)) in enumerate(zip(self.pushes, self.ranges, strict=True)):
            if same:
                encoder.codec.load_state_dict(state["codecs"][k])
            if encoder.residual is not None and state["residual"] is not None:
                encoder.residual.copy_(state["residual"][a:b])
        for copy, (a, b) in zip(self.replies or (), self.ranges, strict=False):
            if state["copy"] is not None:
                copy.values.copy_(state["copy"][a:b])


class BucketCodecs:
    """One server bucket's codecs: its pushes' decoder and, with compressed replies, a
    sender of each worker's replies with that worker's copy of the bucket."""

    def __init__(self, settings, start: int, stop: int, shapes: Sequence[Sequence[int]],
                 initial: torch.Tensor, workers: int, key: int, seed: int) -> None:
        self.decoder = codec(settings, start, stop, shapes, 0)
        self.decoded = torch.empty(stop - start)
        self.replies = None
        if settings.compress_replies:
            self.replies = [ChangeSender(codec(settings, start, stop, shapes,
                                               codec_seed(seed, REPLIES, w, key)), initial)
                            for w in range(workers)]

    @property
    def words(self) -> int:
        """A push's payload words."""
        return self.decoder.words

    def gradient(self, payload: torch.Tensor) -> torch.Tensor:
        """A push's values, decoded (valid until the next push)."""
        return self.decoder.decode(payload[:self.decoder.words], self.decoded)

    def reply(self, worker: int, weights: torch.Tensor, out: torch.Tensor) -> None:
        """Encode `worker`'s reply, the bucket's change since its copy, into `out`."""
        self.replies[worker].encode(weights, out)

    def restart(self, weights: torch.Tensor) -> None:
        """Every worker holds these parameters now (a Strategy-Switch's handover)."""
        self.restart_copies([weights] * len(self.replies or ()))

    def restart_copies(self, copies: list[torch.Tensor]) -> None:
        """Each worker holds its own of these (a checkpoint's, re-sliced)."""
        for sender, copy in zip(self.replies or (), copies, strict=True):
            sender.copy.copy_(copy)

    def state_dict(self) -> dict | None:
        if self.replies is None:
            return None
        return {"copies": [s.copy.clone() for s in self.replies],
                "codecs": [s.codec.state_dict() for s in self.replies]}

    def load_state_dict(self, state: dict | None) -> None:
        if self.replies is None or state is None:
            return
        for sender, copy, kept in zip(self.replies, state["copies"], state["codecs"],
                                      strict=True):
            sender.copy.copy_(copy)
            sender.codec.load_state_dict(kept)
