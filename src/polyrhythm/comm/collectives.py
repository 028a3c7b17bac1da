"""All-reduce over point-to-point messages: ring, binomial tree and reduce-broadcast.

Every algorithm is a *schedule*: a pure function of (members N, my index i, numel) returning a
list of rounds, each a list of `Op(op, peer, start, stop)` on the index range [start, stop) of
the flattened tensor. One executor runs any schedule over the `Transport`, so every byte is
counted in the one place all point-to-point messages go through, and the schedules themselves
can be checked without processes (the tests run all members' schedules against each other in
one process).

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

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import torch

from polyrhythm.comm.transport import Transport
from polyrhythm.flat import shard_ranges

SEND, RECV_ADD, RECV_COPY = "send", "recv_add", "recv_copy"

# Round r of a schedule travels with tag TAG_BASE + r. The parameter server uses tag 0 for
# pushes and the bucket id (below 2**24) for replies, the decentralised strategies 2**24 + 1
# and 2**24 + 2: this range meets none of them.
TAG_BASE = 2**25

# The ring splits each chunk into segments of at least this many elements (2 MiB of float32),
# each its own round, so that one segment travels while the previous one is added (as Gloo's
# own ring does). Measured on 2 cores, 4 processes: 16 MiB with 2 MiB segments 1.47x -> 1.28x
# native; 4 MiB with 512 KiB segments 1.3x -> 2.7x (every round costs a message latency).
RING_SEGMENT_NUMEL = 1 << 19


class Op(NamedTuple):
    """One message of a round: send, or receive and add, or receive and overwrite, the index
    range [start, stop) of the flat tensor, to or from the member with index `peer`."""

    op: str
    peer: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


Round = list[Op]
Schedule = list[Round]


def _round(*ops: tuple[str, int, tuple[int, int]]) -> Round:
    """A round of the given (op, peer, (start, stop)), empty ranges left out."""
    return [Op(op, peer, start, stop) for op, peer, (start, stop) in ops if stop > start]


def ring_schedule(n: int, i: int, numel: int, segments: int | None = None) -> Schedule:
    """Reduce-scatter then all-gather over N chunks around the ring i -> i+1 (mod N).

    Reduce-scatter, round s = 0..N-2: send chunk i-s to the right, receive chunk i-s-1 from the
    left and add it. Chunk c starts at member c and gains one contribution per hop, so after
    N-1 rounds member i holds the complete sum of chunk i+1; the chunk it adds in round s is the
    one it sends in round s+1. All-gather, round s = 0..N-2: send chunk i+1-s (the complete one
    it owns, then the one just received) and receive chunk i-s, overwriting. The sent and the
    received chunk of a round always differ, so the received one can land in place.

    Pipelining: with S segments per chunk (by default one per RING_SEGMENT_NUMEL elements of a
    chunk, at least one) each of these 2(N-1) steps becomes S rounds, one segment each, the same
    bytes in all. Segment k's round sends nothing the round before it writes, so the executor
    posts it while that round is still in flight (`early_ops`): the wire carries one segment
    while the previous one is added.
    """
    if n == 1 or numel == 0:
        return []
    if segments is None:
        segments = max(1, (numel // n) // RING_SEGMENT_NUMEL)
    chunks = shard_ranges(numel, n)

    def piece(c: int, k: int) -> tuple[int, int]:
        start, stop = chunks[c % n]
        a, b = shard_ranges(stop - start, segments)[k]
        return start + a, start + b

    right, left = (i + 1) % n, (i - 1) % n
    reduce_scatter = [_round((SEND, right, piece(i - s, k)), (RECV_ADD, left, piece(i - s - 1, k)))
                      for s in range(n - 1) for k in range(segments)]
    all_gather = [_round((SEND, right, piece(i + 1 - s, k)), (RECV_COPY, left, piece(i - s, k)))
                  for s in range(n - 1) for k in range(segments)]
    return reduce_scatter + all_gather


def reduce_broadcast_schedule(n: int, i: int, numel: int) -> Schedule:
    """Member 0 receives every tensor, adds them in member order, sends the sum to everyone.

    The root needs N-1 receive buffers of the whole tensor and moves (N-1)·|w| each way: the
    centralised baseline whose root link is the bottleneck the ring removes.
    """
    if n == 1 or numel == 0:
        return []
    whole = (0, numel)
    if i == 0:
        others = range(1, n)
        return [_round(*((RECV_ADD, j, whole) for j in others)),
                _round(*((SEND, j, whole) for j in others))]
    return [_round((SEND, 0, whole)), _round((RECV_COPY, 0, whole))]


def tree_schedule(n: int, i: int, numel: int) -> Schedule:
    """Binomial-tree reduce to member 0, then binomial-tree broadcast from it.

    Reduce, round k = 0..L-1 with L = ceil(log2 N) and mask 2^k: a member whose lowest set bit
    is k sends its partial sum to i - 2^k and is done; a member divisible by 2^(k+1) receives
    from i + 2^k (if that exists) and adds. Broadcast runs the same tree backwards, each member
    receiving the sum once from its parent and forwarding it to its children. Every member's
    schedule has 2L rounds (some empty), so round r means the same tag for everyone.
    """
    if n == 1 or numel == 0:
        return []
    whole = (0, numel)
    masks = [1 << k for k in range((n - 1).bit_length())]

    def level(mask: int, with_parent: str, with_child: str) -> Round:
        """This member's round on the tree level of `mask`: with its parent, with its child
        (if it exists) or none."""
        if i % (2 * mask) == mask:
            return _round((with_parent, i - mask, whole))
        if i % (2 * mask) == 0 and i + mask < n:
            return _round((with_child, i + mask, whole))
        return []

    return ([level(mask, SEND, RECV_ADD) for mask in masks]
            + [level(mask, RECV_COPY, SEND) for mask in reversed(masks)])


ALGORITHMS: dict[str, Callable[[int, int, int], Schedule]] = {
    "ring": ring_schedule,
    "reduce-broadcast": reduce_broadcast_schedule,
    "tree": tree_schedule,
}


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
