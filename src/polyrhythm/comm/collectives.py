"""All-reduce over point-to-point messages: ring, binomial tree and reduce-broadcast.

Every algorithm is a *schedule* (layout.py, where the simulator reads them too): a pure
function of (members N, my index i, numel) returning a list of rounds, each a list of
`Op(op, peer, start, stop)` on the index range [start, stop) of the flattened tensor. One
executor runs any schedule over the `Transport`, so every byte is counted in the one place
all point-to-point messages go through, and the schedules themselves can be checked without
processes (the tests run all members' schedules against each other in one process).

Per round the executor posts all receives, then all sends (and what of the next round may go
early), waits for all of them, and only then applies the received data: `recv_copy` lands
straight in the tensor, `recv_add` in a buffer of its own that is added afterwards. A schedule
therefore never writes a range it sends in the same round (a send buffer must not change while
in flight), which the tests check. Zero-length ranges are left out of a schedule on both sides,
so tensors smaller than N and sizes that N does not divide need no special case.

Every member ends with the same bits, not just the same value up to rounding: each element's
final sum is computed at exactly one member, in a fixed order, and copied to the others. That
matters because every all-reduce worker steps its own optimizer copy; the copies must not
drift apart.

The three algorithms trade latency against bandwidth (see Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005), with |w| the
tensor's size:

- `ring`: reduce-scatter then all-gather around a ring, 2(N-1) steps of |w|/N per member
  (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  JPDC 2009; popularised for deep learning by Baidu's ring all-reduce and Horovod). Each member
  sends and receives 2(N-1)/N·|w|, independent of N: bandwidth optimal, latency linear in N.
- `tree`: binomial-tree reduce to member 0, then binomial-tree broadcast (MPICH's short-message
  algorithms): 2⌈log2 N⌉ rounds of the whole tensor; few rounds, but |w| per message.
- `reduce-broadcast`: member 0 receives everyone's tensor, sums them and sends the sum back, as
  a parameter server on the CPU would ("PSCPU"): two rounds, but the root's traffic, (N-1)·|w|
  each way, grows linearly in N.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from polyrhythm.comm.transport import Transport
from polyrhythm.layout import (
    ALGORITHMS,
    GATHERS,
    RECV_ADD,
    RECV_COPY,
    SEND,
    Op,
    Round,
    Schedule,
)

# Round r of a schedule travels with tag TAG_BASE + r. The parameter server uses tag 0 for
# pushes and the bucket id (below 2**24) for replies, the decentralised strategies 2**24 + 1
# and 2**24 + 2: this range meets none of them.
TAG_BASE = 2**25

def _overlaps(op: Op, ops: Iterable[Op]) -> bool:
    return any(op.start < other.stop and other.start < op.stop for other in ops)


def early_ops(current: Round, upcoming: Round) -> Round:
    """The operations of the next non-empty round that may be posted while `current` is in
    flight: every `recv_add` (it lands in a buffer of its own), every `recv_copy` whose range
    `current` does not touch (a send of it may still be reading, an add still to come), and
    every send of a range `current` does not write."""
    written = [op for op in current if op.op != SEND]
    return [op for op in upcoming
            if op.op == RECV_ADD
            or (op.op == RECV_COPY and not _overlaps(op, current))
            or (op.op == SEND and not _overlaps(op, written))]


class _Round:
    """One round's messages in flight: receives, sends, and the adds to apply after them."""

    def __init__(self) -> None:
        self.posted: list[Op] = []
        self.receives: list = []
        self.sends: list = []
        self.adds: list[tuple[torch.Tensor, torch.Tensor]] = []


def schedule_steps(transport: Transport, flat: torch.Tensor, schedule: Schedule,
                   ranks: list[int]) -> Iterator[int]:
    """Run one member's schedule on a flat contiguous tensor (peers are indices into `ranks`),
    yielding once per round r after posting it and before waiting for it: all_reduce runs the
    steps through; the tests interleave all members' steps in one process.

    Round r's messages carry tag TAG_BASE + r. Each round posts what it has not posted yet,
    receives first, then what of the next non-empty round may go early (`early_ops`): a
    receive posted before the peer's send lets Gloo move the data at once, where a late one
    costs a round trip (Gloo holds a send until a ready-to-receive notice arrives). Then it
    waits for its receives and its sends, and applies its adds in schedule order.

    Sends are waited for in their round although no later round needs that: measured on 2
    cores, letting them run on made the ring slower (1 MiB, 4 processes: 1.35-1.7x native
    -> 2.0-2.5x), as a member that runs ahead posts its sends before its peers' receives.
    """
    busy = [r for r, ops in enumerate(schedule) if ops]
    following = dict(zip(busy, busy[1:], strict=False))  # round -> next non-empty round
    rounds = {r: _Round() for r in busy}

    def post(r: int, ops: Round) -> None:
        pending, tag = rounds[r], TAG_BASE + r
        new = [op for op in ops if op not in pending.posted]
        for op in new:
            target = flat[op.start:op.stop]
            if op.op == RECV_ADD:
                buffer = torch.empty(op.numel, dtype=flat.dtype)
                pending.receives.append(transport.irecv(buffer, ranks[op.peer], tag))
                pending.adds.append((target, buffer))
            elif op.op == RECV_COPY:
                pending.receives.append(transport.irecv(target, ranks[op.peer], tag))
        for op in new:
            if op.op == SEND:
                pending.sends.append(transport.isend(flat[op.start:op.stop], ranks[op.peer],
                                                     tag))
        pending.posted += new

    for r, ops in enumerate(schedule):
        if ops:
            post(r, ops)
            if r in following:
                post(following[r], early_ops(ops, schedule[following[r]]))
        yield r
        if ops:
            done = rounds.pop(r)
            for work in done.receives + done.sends:
                work.wait()
            for target, buffer in done.adds:
                target.add_(buffer)


def all_reduce(transport: Transport, tensor: torch.Tensor, ranks: list[int], rank: int,
               algorithm: str) -> None:
    """Sum `tensor` in place over the processes `ranks` (global ranks, the same list in the
    same order on every member; `rank` is this process's), leaving identical bits on all."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"known: {', '.join(ALGORITHMS)}")
    schedule = ALGORITHMS[algorithm](len(ranks), ranks.index(rank), tensor.numel())
    if not schedule:
        return
    contiguous = tensor.is_contiguous()
    flat = (tensor if contiguous else tensor.contiguous()).view(-1)
    for _ in schedule_steps(transport, flat, schedule, ranks):
        pass
    if not contiguous:
        tensor.copy_(flat.view(tensor.shape))


def all_gather(transport: Transport, tensor: torch.Tensor, ranks: list[int], rank: int,
               algorithm: str) -> torch.Tensor:
    """Every member's `tensor` (flat, the same size on all), as rows by member index, on
    every member: the all-gather of the same algorithm (layout.GATHERS)."""
    if algorithm not in GATHERS:
        raise ValueError(f"unknown all-gather algorithm {algorithm!r}; "
                         f"known: {', '.join(GATHERS)}")
    n, me, size = len(ranks), ranks.index(rank), tensor.numel()
    rows = torch.empty(n, size, dtype=tensor.dtype)
    rows[me] = tensor.view(-1)
    for _ in schedule_steps(transport, rows.view(-1), GATHERS[algorithm](n, me, size), ranks):
        pass
    return rows
