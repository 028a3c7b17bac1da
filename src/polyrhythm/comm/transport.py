"""The one door to the wire: every message, collective and object gather of a job goes through
a `Transport`, so bytes are counted once, here, and latency is added here (comm/delay.py).

Only this package and the launchers import torch.distributed. Collectives run over a named
group: WORLD (every rank of the job) or WORKERS (the workers only, so a job with servers can
still average its workers' models).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from polyrhythm.comm.delay import DelayLine, Posted

WORLD, WORKERS = "world", "workers"
NATIVE = "native"  # the engine's own all-reduce (Gloo); other algorithms: comm/collectives.py


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

    def snapshot(self) -> dict[str, int]:
        return asdict(self)

    def moved(self) -> tuple[int, int]:
        """Bytes sent and received so far, native collectives' payload included."""
        native = self.native_collective_bytes
        return self.bytes_sent + native, self.bytes_received + native


class PeerLost(RuntimeError):
    """A peer's connection broke (its process died) while this one waited for its messages."""

    def __init__(self, rank: int, cause: Exception) -> None:
        why = str(cause).splitlines()[0] if str(cause) else repr(cause)
        super().__init__(f"rank {rank} is gone: {why}")
        self.rank = rank


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Transport:
    """Point-to-point tensor messages, collectives over named groups and object gathers, on
    the default process group (Gloo). `open` names the groups once the process group is up."""

    def __init__(self) -> None:
        self.counters = TrafficCounters()
        self.rank = 0
        self._members: dict[str, list[int]] = {}
        self._groups: dict[str, Any] = {}
        self._line: DelayLine | None = None

    def open(self, rank: int, world_size: int, workers: list[int],
             latency: Callable[[], float] | None = None) -> None:
        """Name the groups: WORLD, every rank, and WORKERS, the given ranks. With `latency`
        (a function drawing one message's extra one-way latency in seconds), every message
        and collective pays it."""
        self.rank = rank
        self._line = DelayLine(latency) if latency is not None else None
        self._members = {WORLD: list(range(world_size)), WORKERS: list(workers)}
        # A group equal to the world is the default group: no second communicator. Another
        # is made when its members first use it (below), so a job whose workers never meet
        # in a collective (a parameter server's) sets up no communicator it does not use.
        self._groups = {name: None for name, ranks in self._members.items()
                        if len(ranks) == world_size}

    def exclude(self, lost: set[int]) -> None:
        """Go on without the ranks in `lost` (their processes died): WORLD and WORKERS become
        the survivors, in groups of their own made at their first use. Every survivor must
        call this with the same ranks, before its next collective."""
        self._members = {name: [r for r in ranks if r not in lost]
                         for name, ranks in self._members.items()}
        self._groups = {}
        # Made now, by every survivor, before any other group: a new group's set-up hangs
        # when some of its members made another group first (seen with Gloo, torch 2.13).
        self._group(WORLD)

    def _group(self, name: str) -> Any:
        if name not in self._groups:
            # Only the members call this, at their first collective of the group, which all
            # of them reach in the same order.
            self._groups[name] = dist.new_group(self._members[name],
                                                use_local_synchronization=True)
        return self._groups[name]

    # --- point to point ------------------------------------------------------------------

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work | Posted:
        self.counters.bytes_sent += _nbytes(tensor)
        self.counters.messages_sent += 1
        if self._line is not None:
            return self._line.send(tensor, dst, tag)
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        self.count_received(tensor)
        return dist.irecv(tensor, src, tag=tag)

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Messages of the job's own bookkeeping (who is left after training), not of its
        training: left out of the counters."""
        kept = replace(self.counters)
        try:
            yield
        finally:
            self.counters = kept

    def count_received(self, tensor: torch.Tensor) -> None:
        self.counters.bytes_received += _nbytes(tensor)
        self.counters.messages_received += 1

    def receiver(self, sources: list[int], numel: int, tag: int = 0, *,
                 last: Callable[[torch.Tensor], bool] | None = None) -> Receiver:
        """Messages of `numel` float32 values from `sources`, in arrival order (see Receiver)."""
        return Receiver(self, sources, numel, tag, last=last)

    # --- collectives ---------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, group: str = WORKERS,
                   algorithm: str = NATIVE) -> None:
        """Sum `tensor` in place over a named group, by Gloo's own all-reduce (its payload
        counted apart) or by a schedule of point-to-point messages (counted as messages)."""
        if algorithm == NATIVE:
            self.counters.native_collective_bytes += _nbytes(tensor)
            if self._line is not None:
                # One call into Gloo, whose messages cannot be held one by one: the call
                # waits for the rounds of a ring all-reduce (Gloo's), 2(n-1) messages in a row.
                self._line.hold(2 * (len(self._members[group]) - 1))
            dist.all_reduce(tensor, group=self._group(group))
            return
        from polyrhythm.comm.collectives import all_reduce

        all_reduce(self, tensor, self._members[group], self.rank, algorithm)

    def rows_of_members(self, row: torch.Tensor, group: str = WORKERS) -> torch.Tensor:
        """Every member's `row` (1-D float64), as a table by member, on every member.

        One all-reduce of a table that holds this member's row and zeros elsewhere: each
        entry is one member's value plus zeros, so every member gets the same bits whatever
        order the reduction adds in, and a decision taken from the table is the same on all.
        """
        members = self._members[group]
        table = torch.zeros(len(members), row.numel(), dtype=torch.float64)
        table[members.index(self.rank)] = row
        self.all_reduce(table, group)
        return table

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's `obj` on rank `dst` (a list by rank), None elsewhere. Used for the
        reports at the end of a run, once their traffic figures are taken: not counted."""
        gathered = [None] * len(self._members[WORLD]) if self.rank == dst else None
        dist.gather_object(obj, gathered, dst=dst, group=self._group(WORLD))
        return gathered

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank `src`'s `obj` on every rank (set-up, before the clocks start: not counted)."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank, once this rank's delayed messages are all on the wire."""
        if self._line is not None:
            self._line.drain()
        dist.barrier(group=self._group(WORLD))


class Receiver:
    """Messages of a fixed size from known ranks in arrival order, like a receive from any
    rank, but with each rank's receive posted ahead of time by a thread of its own.

    Gloo's receive-from-any costs an extra round trip per message (the receiver must first ask
    the sender); a receive posted for a known rank lets the data flow at once. Each thread
    waits on its rank's posted receive (the wait releases the GIL) and queues the message.
    Two ways to go on:

    - without `last` (a server's pushes): one buffer per rank, whose next receive is posted
      once the caller has used it (`release`); a rank's last message is the one released
      with `more=False`;
    - with `last` (gossip): a fresh buffer per message and the next receive posted at once,
      so a sender never waits for this process's loop to get round to its previous message
      (two workers waiting for each other's loops would deadlock); a rank's last message is
      the one `last(message)` is true of.

    Bytes are counted when the caller takes a message, on one thread.
    """

    def __init__(self, transport: Transport, sources: list[int], numel: int, tag: int = 0, *,
                 last: Callable[[torch.Tensor], bool] | None = None) -> None:
        self.transport, self.numel, self.tag, self.last = transport, numel, tag, last
        self._arrived: queue.SimpleQueue[tuple[int, torch.Tensor] | Exception] = (
            queue.SimpleQueue())
        self._go_on = {s: queue.SimpleQueue() for s in sources} if last is None else {}
        for src in sources:
            threading.Thread(target=self._receive, args=(src,), daemon=True,
                             name=f"recv-from-{src}").start()

    def _receive(self, src: int) -> None:
        buffer = torch.empty(self.numel)
        try:
            while True:
                dist.irecv(buffer, src, tag=self.tag).wait()  # counted in take(), one thread
                self._arrived.put((src, buffer))
                if self.last is None:
                    if not self._go_on[src].get():  # released, with more to come or not
                        return
                elif self.last(buffer):
                    return
                else:
                    buffer = torch.empty(self.numel)
        except Exception as exc:  # e.g. the peer died: the caller's next take() raises it
            self._arrived.put(PeerLost(src, exc))

    def take(self, block: bool = True) -> tuple[int, torch.Tensor] | None:
        """The next message as (rank, buffer); None if none is in and not `block`. Raises
        PeerLost if a source's receive failed (it sends nothing more)."""
        try:
            item = self._arrived.get(block=block)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        self.transport.count_received(item[1])
        return item

    def waiting(self) -> int:
        """Messages arrived and not yet taken: a server's queue."""
        return self._arrived.qsize()

    def release(self, src: int, more: bool = True) -> None:
        """(Without `last`.) The buffer of `src` is free again; post its next receive unless
        it sends no more."""
        self._go_on[src].put(more)
