"""The one place point-to-point messages leave and arrive, so bytes are counted once, here."""

from __future__ import annotations

import queue
import threading
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
    # Payload handed to the engine's own collectives (Gloo): what goes over the wire then
    # depends on Gloo's algorithm, so it is reported apart from the bytes counted above.
    native_collective_bytes: int = 0


class Transport:
    """Point-to-point tensor messages over the default process group (Gloo)."""

    def __init__(self) -> None:
        self.counters = TrafficCounters()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        self.counters.bytes_sent += tensor.numel() * tensor.element_size()
        self.counters.messages_sent += 1
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        self.count_received(tensor)
        return dist.irecv(tensor, src, tag=tag)

    def count_collective(self, tensor: torch.Tensor) -> None:
        self.counters.native_collective_bytes += tensor.numel() * tensor.element_size()

    def count_received(self, tensor: torch.Tensor) -> None:
        self.counters.bytes_received += tensor.numel() * tensor.element_size()
        self.counters.messages_received += 1


class PushReceiver:
    """Receives fixed-size messages from known ranks in arrival order, like a receive from any
    rank, but with each rank's receive posted ahead of time.

    Gloo's receive-from-any costs an extra round trip per message (the receiver must first
    ask the sender); a receive posted for a known rank lets the data flow at once. One thread
    per rank waits on its posted receive (the wait releases the GIL) and queues its rank when
    the message is in; the rank's next receive is posted only once the caller has used the
    buffer (`release`).
    """

    def __init__(self, transport: Transport, sources: list[int], numel: int) -> None:
        self.transport = transport
        self.buffers = {s: torch.empty(numel) for s in sources}
        self._arrived: queue.SimpleQueue[int | Exception] = queue.SimpleQueue()
        self._go_on = {s: queue.SimpleQueue() for s in sources}
        self._threads = [threading.Thread(target=self._receive, args=(s,), daemon=True,
                                          name=f"recv-from-{s}") for s in sources]
        for t in self._threads:
            t.start()

    def _receive(self, src: int) -> None:
        try:
            while True:
                dist.irecv(self.buffers[src], src).wait()  # counted in next(), one thread
                self._arrived.put(src)
                if not self._go_on[src].get():
                    return
        except Exception as exc:  # e.g. the peer died: the caller's next() raises it
            self._arrived.put(exc)

    def next(self) -> tuple[int, torch.Tensor]:
        """Block until some rank's message is in; return the rank and its buffer."""
        src = self._arrived.get()
        if isinstance(src, Exception):
            raise src
        self.transport.count_received(self.buffers[src])
        return src, self.buffers[src]

    def waiting(self) -> int:
        """Messages arrived and not yet taken: the server's queue."""
        return self._arrived.qsize()

    def release(self, src: int, more: bool = True) -> None:
        """The buffer of `src` is free again; post its next receive unless it sends no more."""
        self._go_on[src].put(more)
