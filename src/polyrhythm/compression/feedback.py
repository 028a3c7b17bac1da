"""What a sender keeps around a codec.

- `Encoder`: a gradient's sender with error feedback (Seide et al. 2014; Karimireddy et al.,
  "Error Feedback Fixes SignSGD", ICML 2019): it adds what its last messages did not carry
  (the residual) to the values it encodes now, and keeps what this message does not carry.
  Over T messages, what was decoded plus the last residual is what was given, exactly up
  to rounding.
- `ChangeSender` and `Copy`: a tensor that lives on both sides (a server's parameters, a
  worker's model in D-PSGD or gossip), sent as its change since what the receiver holds.
  The sender keeps the receiver's copy, so what a message leaves out is sent later (error
  feedback by construction, as DoubleSqueeze's server and CHOCO-SGD's public copies do); the
  receiver's `Copy` adds each decoded change to its own.
"""

from __future__ import annotations

import torch

from polyrhythm.compression.codecs import Codec


class Encoder:
    """A codec with, where `feedback`, its residual."""

    def __init__(self, codec: Codec, feedback: bool) -> None:
        self.codec = codec
        self.residual = torch.zeros(codec.numel) if feedback else None
        self._decoded = torch.empty(codec.numel) if feedback else None

    @property
    def words(self) -> int:
        return self.codec.words

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        """Encode `values` (plus the residual) into `out`, keeping what it leaves out."""
        if self.residual is None:
            self.codec.encode(values, out)
            return
        given = values + self.residual
        self.codec.encode(given, out)
        torch.sub(given, self.codec.decode(out, self._decoded), out=self.residual)

    def state_dict(self) -> dict:
        return {"codec": self.codec.state_dict(), "residual": None if self.residual is None
                else self.residual.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state["codec"])
        if self.residual is not None and state["residual"] is not None:
            self.residual.copy_(state["residual"])


class ChangeSender:
    """Sends a tensor as its change since the receiver's copy, which it keeps (`copy`)."""

    def __init__(self, codec: Codec, initial: torch.Tensor) -> None:
        self.codec = codec
        self.copy = initial.clone()
        self._decoded = torch.empty(codec.numel)

    def encode(self, values: torch.Tensor, out: torch.Tensor) -> None:
        """Encode `values` - copy into `out`; the copy then holds what the receiver will."""
        self.codec.encode(values - self.copy, out)
        self.copy.add_(self.codec.decode(out, self._decoded))

    def state_dict(self) -> dict:
        return {"codec": self.codec.state_dict(), "copy": self.copy.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state["codec"])
        self.copy.copy_(state["copy"])


class Copy:
    """The receiver's side of a ChangeSender: its copy of the tensor, `values`."""

    def __init__(self, codec: Codec, initial: torch.Tensor) -> None:
        self.codec = codec
        self.values = initial.clone()
        self._decoded = torch.empty(codec.numel)

    def apply(self, payload: torch.Tensor) -> torch.Tensor:
        """Add a message's change; the copy as it is now."""
        return self.values.add_(self.codec.decode(payload, self._decoded))

    def state_dict(self) -> dict:
        return {"values": self.values.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.values.copy_(state["values"])
