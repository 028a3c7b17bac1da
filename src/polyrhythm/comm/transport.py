"""The one place point-to-point messages leave and arrive, so bytes are counted once, here."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class TrafficCounters:
    """Bytes and messages this process sent and received."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class Transport:
    """Point-to-point tensor messages over the default process group (Gloo)."""

    def __init__(self) -> None:
        self.counters = TrafficCounters()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        self.counters.bytes_sent += tensor.numel() * tensor.element_size()
        self.counters.messages_sent += 1
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        self._count_received(tensor)
        return dist.irecv(tensor, src, tag=tag)

    def recv_any(self, tensor: torch.Tensor, tag: int = 0) -> int:
        """Block until a message from any rank fills `tensor`; return the sender's rank."""
        src = dist.recv(tensor, tag=tag)
        self._count_received(tensor)
        return src

    def _count_received(self, tensor: torch.Tensor) -> None:
        self.counters.bytes_received += tensor.numel() * tensor.element_size()
        self.counters.messages_received += 1
