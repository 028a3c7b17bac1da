"""The one door to the wire: every message, collective and object gather of a job goes through
a `Transport`, so bytes are counted once, here, and latency is added here (comm/delay.py).
What torch.distributed raises is read here too (comm/faults.py): a peer that is gone raises
PeerLost, one that is silent PeerSilent, and any other error keeps its type.

Only this package and the launchers import torch.distributed. Collectives run over a named
group: WORLD (every rank of the job) or WORKERS (the workers only, so a job with servers can
still average its workers' models).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from polyrhythm.comm.delay import DelayLine, Posted
from polyrhythm.comm.faults import PeerFault, PeerLost, PeerSilent, on_the_wire
from polyrhythm.comm.network_threads import calm_network_threads, sharing_cores
from polyrhythm.comm.posting import post_receive, post_send
from polyrhythm.comm.receiver import Receiver, first_message
from polyrhythm.comm.waiting import wait_within

if TYPE_CHECKING:
    from polyrhythm.comm.membership import Membership

__all__ = ["NATIVE", "WORKERS", "WORLD", "Pending", "PeerFault", "PeerLost", "PeerSilent",
           "TrafficCounters", "Transport"]

WORLD, WORKERS = "world", "workers"
NATIVE = "native"  # the engine's own all-reduce (Gloo); other algorithms: comm/collectives.py
RING = "ring"


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


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Pending:
    """A send or receive on its way. `wait()` returns once it is done, counting a receive's
    bytes then (a receive posted and never completed moved nothing), and raises PeerLost or
    PeerSilent if the peer is gone or silent. Waiting again returns at once (a Gloo work
    waited for twice waits out the timeout)."""

    def __init__(self, work: dist.Work | Posted, peer: int,
                 receiver: Transport | None = None, received: torch.Tensor | None = None,
                 ) -> None:
        self._work: dist.Work | Posted | None = work
        self.peer = peer
        self._receiver, self._received = receiver, received  # a receive: who counts what

    def wait(self, within: float | None = None) -> bool:
        """Wait until it is done; with `within` (seconds), PeerSilent if it is not done by
        then, on a clock of its own, never Gloo's (comm/waiting.py): a rank that means to go
        on without a silent peer waits so."""
        if self._work is not None:
            with on_the_wire(self.peer):
                if within is None:
                    self._work.wait()
                else:
                    wait_within(self._work, self.peer, within)
            self._work = None
            if self._receiver is not None:
                self._receiver.count_received(self._received)
        return True


    @property
    def work(self) -> dist.Work | Posted | None:
        """What is on its way, for a caller that waits for it on a thread of its own, with
        no timeout of Gloo's, keeping its own time (comm/membership.py); `settle` once it
        is done."""
        return self._work

    def settle(self) -> None:
        """Done (its work waited for elsewhere): a receive's bytes are counted now, on the
        caller's thread."""
        self._work = None
        if self._receiver is not None:
            self._receiver.count_received(self._received)
            self._receiver = None


class Transport:
    """Point-to-point tensor messages, collectives over named groups and object gathers, on
    the default process group (Gloo). `open` names the groups once the process group is up."""

    def __init__(self) -> None:
        # One object for the transport's life: a resource sampler holds its `moved`.
        self.counters = TrafficCounters()
        self._uncounted = 0  # depth of uncounted() blocks this process is in
        self.rank = 0
        self._members: dict[str, list[int]] = {}
        self._groups: dict[str, Any] = {}
        self._line: DelayLine | None = None
        self._calm = False  # whether Gloo's network threads share cores (network_threads.py)
        self.timeout: float | None = None  # seconds a peer may be silent (open)
        self.membership: Membership | None = None  # the workers', where they may change

    def open(self, rank: int, world_size: int, workers: list[int],
             latency: Callable[[], float] | None = None, timeout: float | None = None,
             elastic: int | None = None) -> None:
        """Name the groups: WORLD, every rank, and WORKERS, the given ranks. With `latency`
        (a function drawing one message's extra one-way latency in seconds), every message
        and collective pays it. `timeout`: the process group's, in seconds, which a
        Receiver keeps itself (see there). `elastic`: the workers' collectives go on without
        a worker lost, while at least that many are left (comm/membership.py)."""
        self.rank, self.timeout = rank, timeout
        self._line = DelayLine(latency) if latency is not None else None
        # Ranks on this machine: torchrun says; the local launchers start them all here.
        self._calm = sharing_cores(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if self._calm:
            calm_network_threads()
        self._members = {WORLD: list(range(world_size)), WORKERS: list(workers)}
        # A group equal to the world is the default group: no second communicator. Another
        # is made when its members first use it (below), so a job whose workers never meet
        # in a collective (a parameter server's) sets up no communicator it does not use.
        self._groups = {name: None for name, ranks in self._members.items()
                        if len(ranks) == world_size}
        if elastic is not None and rank in workers:
            from polyrhythm.comm.membership import Membership

            self.membership = Membership(self, workers, timeout, elastic)

    def members(self, group: str = WORKERS) -> list[int]:
        """The group's members now (global ranks, in order): the workers' as their
        membership has them, where they may change."""
        if group == WORKERS and self.membership is not None:
            return list(self.membership.members)
        return list(self._members[group])

    def exclude(self, lost: set[int]) -> None:
        """Go on without the ranks in `lost` (their processes died): WORLD and WORKERS become
        the survivors, in groups of their own made at their first use. Every survivor must
        call this with the same ranks, before its next collective."""
        self._members = {name: [r for r in ranks if r not in lost]
                         for name, ranks in self._members.items()}
        if self.membership is not None:  # every survivor drops the same ranks, here alike
            self.membership.members = self._members[WORKERS]
        # torch names a group made by its members alone after its ranks and the number of
        # groups the process has, and its members meet under that name: each survivor must
        # have as many groups, or each waits for the others under a name of its own. The
        # groups made so far held the lost ranks (workers may have made WORKERS', servers
        # none): they go, leaving the default group alone on every survivor.
        for group in self._groups.values():
            if group is not None:  # None: the default group
                dist.destroy_process_group(group)
        self._groups = {}
        # Made now, by every survivor, before any other group: the same count on each.
        with on_the_wire():
            self._group(WORLD)

    def _group(self, name: str) -> Any:
        if name not in self._groups:
            # Only the members call this, at their first collective of the group, which all
            # of them reach in the same order.
            self._groups[name] = dist.new_group(self._members[name],
                                                use_local_synchronization=True)
            if self._calm:
                calm_network_threads()  # the group's own loop thread
        return self._groups[name]

    # --- point to point ------------------------------------------------------------------

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Pending:
        """Send `tensor` to rank `dst` (counted now: it is on its way)."""
        if not self._uncounted:
            self.counters.bytes_sent += _nbytes(tensor)
            self.counters.messages_sent += 1
        with on_the_wire(dst):
            return Pending(self._post_send(tensor, dst, tag), dst)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Pending:
        """Receive into `tensor` from rank `src` (counted when it completes)."""
        with on_the_wire(src):
            work = self._post_receive(tensor, src, tag)
        return Pending(work, src, self, tensor)

    def _post_send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work | Posted:
        if self._line is not None:
            return self._line.send(tensor, dst, tag)
        return post_send(tensor, dst, tag)

    def _post_receive(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        return post_receive(tensor, src, tag)

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Messages of the job's own bookkeeping (who is left after training), not of its
        training: what is sent, or completes, inside the block is left out of the counters.
        The counters stay the same object and count again after it."""
        self._uncounted += 1
        try:
            yield
        finally:
            self._uncounted -= 1

    def receive_first(self, tensor: torch.Tensor, sources: list[int], tag: int,
                      within: float | None = None) -> int:
        """Receive the message whichever of `sources` sends first; its rank (receiver.py)."""
        return first_message(self, tensor, sources, tag, within)

    @property
    def counting_paused(self) -> bool:
        """Inside an uncounted() block: the job's bookkeeping, not its training."""
        return self._uncounted > 0

    def count_received(self, tensor: torch.Tensor) -> None:
        if not self._uncounted:
            self.counters.bytes_received += _nbytes(tensor)
            self.counters.messages_received += 1

    def receiver(self, sources: list[int], numel: int, tag: int = 0, *,
                 last: Callable[[torch.Tensor], bool] | None = None) -> Receiver:
        """Messages of `numel` float32 values from `sources`, in arrival order
        (comm/receiver.py)."""
        return Receiver(self, sources, numel, tag, last=last)

    # --- collectives ---------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, group: str = WORKERS,
                   algorithm: str = NATIVE) -> None:
        """Sum `tensor` in place over a named group, by Gloo's own all-reduce (its payload
        counted apart) or by a schedule of point-to-point messages (counted as messages).
        The workers' sums where they may change go on without a worker lost meanwhile, by
        a schedule of messages (`native`: the ring's; Gloo's groups cannot change)."""
        if group == WORKERS and self.membership is not None:
            self.membership.all_reduce(tensor, RING if algorithm == NATIVE else algorithm)
            return
        if algorithm == NATIVE:
            if not self._uncounted:
                self.counters.native_collective_bytes += _nbytes(tensor)
            if self._line is not None:
                # One call into Gloo, whose messages cannot be held one by one: the call
                # waits for the rounds of a ring all-reduce (Gloo's), 2(n-1) messages in a row.
                self._line.hold(2 * (len(self._members[group]) - 1))
            with on_the_wire():
                dist.all_reduce(tensor, group=self._group(group))
            return
        from polyrhythm.comm.collectives import all_reduce

        all_reduce(self, tensor, self._members[group], self.rank, algorithm)

    def all_gather(self, tensor: torch.Tensor, group: str = WORKERS,
                   algorithm: str = NATIVE) -> torch.Tensor:
        """Every member's `tensor` (flat, alike in size), as rows by member, on every member:
        by Gloo's own all-gather (this member's payload counted apart) or by a schedule of
        point-to-point messages of the same algorithm as all_reduce's (counted as messages)."""
        members = self.members(group)
        if algorithm == NATIVE:
            if not self._uncounted:
                self.counters.native_collective_bytes += _nbytes(tensor)
            if self._line is not None:
                self._line.hold(len(members) - 1)  # Gloo's ring: N-1 messages in a row
            rows = torch.empty(len(members), tensor.numel(), dtype=tensor.dtype)
            with on_the_wire():
                dist.all_gather(list(rows.unbind(0)), tensor.view(-1),
                                group=self._group(group))
            return rows
        from polyrhythm.comm.collectives import all_gather

        return all_gather(self, tensor, members, self.rank, algorithm)

    def rows_of_members(self, row: torch.Tensor, group: str = WORKERS) -> torch.Tensor:
        """Every member's `row` (1-D float64), as a table by member, on every member.

        One all-reduce of a table that holds this member's row and zeros elsewhere: each
        entry is one member's value plus zeros, so every member gets the same bits whatever
        order the reduction adds in, and a decision taken from the table is the same on all.
        """
        members = self.members(group)
        table = torch.zeros(len(members), row.numel(), dtype=torch.float64)
        table[members.index(self.rank)] = row
        self.all_reduce(table, group)
        return table

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's `obj` on rank `dst` (a list by rank), None elsewhere. Used for the
        reports at the end of a run, once their traffic figures are taken: not counted."""
        gathered = [None] * len(self._members[WORLD]) if self.rank == dst else None
        with on_the_wire():
            dist.gather_object(obj, gathered, dst=dst, group=self._group(WORLD))
        return gathered

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank `src`'s `obj` on every rank (set-up, before the clocks start: not counted)."""
        box = [obj]
        with on_the_wire():  # among the survivors, where workers were lost (exclude)
            dist.broadcast_object_list(box, src=src, group=self._group(WORLD))
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank, once this rank's delayed messages are all on the wire."""
        with on_the_wire():
            if self._line is not None:
                self._line.drain()
            dist.barrier(group=self._group(WORLD))
