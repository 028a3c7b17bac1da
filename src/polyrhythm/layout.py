"""How parameters and messages are laid out, as pure arithmetic (no torch): the flat
model's split into server shards and buckets, and the all-reduce schedules. The runtime
(flat.py, comm/collectives.py) and the simulator (sim/) use the same functions, so the
simulator moves the messages the real system moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

SEND, RECV_ADD, RECV_COPY = "send", "recv_add", "recv_copy"

# The ring splits each chunk into segments of at least this many elements (2 MiB of float32),
# each its own round, so that one segment travels while the previous one is added (as Gloo's
# own ring does). Measured on 2 cores, 4 processes: 16 MiB with 2 MiB segments 1.47x -> 1.28x
# native; 4 MiB with 512 KiB segments 1.3x -> 2.7x (every round costs a message latency).
RING_SEGMENT_NUMEL = 1 << 19


def shard_ranges(numel: int, shards: int) -> list[tuple[int, int]]:
    """Split [0, numel) into `shards` contiguous ranges whose sizes differ by at most one."""
    base, extra = divmod(numel, shards)
    ranges, start = [], 0
    for j in range(shards):
        stop = start + base + (1 if j < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def bucket_ranges(start: int, stop: int, bucket_elements: int) -> list[tuple[int, int]]:
    """Split one shard [start, stop) into near-equal buckets of at most ~bucket_elements.

    Buckets are the unit of communication: a bucket's gradient is pushed as soon as backward
    has produced it, so most of the traffic overlaps the rest of backward.
    """
    count = max(1, -(-(stop - start) // max(1, bucket_elements)))
    return [(start + a, start + b) for a, b in shard_ranges(stop - start, count)]


class BucketLayout:
    """Every bucket of the model, shared by workers and servers so both agree on message sizes.

    `buckets[k] = (server, start, stop)`: bucket k is parameters [start, stop) on that server.
    """

    def __init__(self, numel: int, servers: int, bucket_kb: int | None) -> None:
        # float32; None: one bucket per server
        bucket_elements = numel if bucket_kb is None else bucket_kb * 1024 // 4
        self.buckets = [(server, a, b)
                        for server, (start, stop) in enumerate(shard_ranges(numel, servers))
                        for a, b in bucket_ranges(start, stop, bucket_elements)]

    def of_server(self, server: int) -> dict[int, tuple[int, int]]:
        """The buckets one server owns, by bucket id."""
        return {k: (a, b) for k, (s, a, b) in enumerate(self.buckets) if s == server}

    def capacity(self, server: int) -> int:
        """Elements in the server's largest bucket: every push to it is padded to this."""
        return max(b - a for a, b in self.of_server(server).values())


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




# All-gathers: every member's `size` values, member j's at [j·size, (j+1)·size) of a buffer of
# N·size, member i's own chunk in place to begin with. Compressed messages that do not add up
# as they are (top-k's pairs, signs, levels) are gathered so (comm/compressed.py), by the same
# three algorithms, each member then decoding and adding every chunk in member order.


def ring_gather_schedule(n: int, i: int, size: int) -> Schedule:
    """Around the ring i -> i+1: in round s = 0..N-2 send chunk i-s to the right, receive
    chunk i-s-1 from the left. Each member sends and receives (N-1)·size."""
    if n == 1 or size == 0:
        return []
    right, left = (i + 1) % n, (i - 1) % n

    def chunk(c: int) -> tuple[int, int]:
        return (c % n) * size, (c % n + 1) * size

    return [_round((SEND, right, chunk(i - s)), (RECV_COPY, left, chunk(i - s - 1)))
            for s in range(n - 1)]


def gather_broadcast_schedule(n: int, i: int, size: int) -> Schedule:
    """Member 0 receives every member's chunk, then sends the whole buffer to each: its
    traffic, (N-1)·size in and (N-1)·N·size out, grows with N, as reduce-broadcast's does."""
    if n == 1 or size == 0:
        return []
    whole = (0, n * size)
    if i == 0:
        return [_round(*((RECV_COPY, j, (j * size, (j + 1) * size)) for j in range(1, n))),
                _round(*((SEND, j, whole) for j in range(1, n)))]
    return [_round((SEND, 0, (i * size, (i + 1) * size))), _round((RECV_COPY, 0, whole))]


def tree_gather_schedule(n: int, i: int, size: int) -> Schedule:
    """Binomial-tree gather to member 0, then binomial-tree broadcast of the whole buffer:
    on level k (mask 2^k) a member whose lowest set bit is k sends the chunks it holds, its
    own and its subtree's [i, i + 2^k), to i - 2^k. 2⌈log2 N⌉ rounds for everyone."""
    if n == 1 or size == 0:
        return []
    masks = [1 << k for k in range((n - 1).bit_length())]

    def chunks(first: int, count: int) -> tuple[int, int]:
        return first * size, min(first + count, n) * size

    def gather(mask: int) -> Round:
        if i % (2 * mask) == mask:
            return _round((SEND, i - mask, chunks(i, mask)))
        if i % (2 * mask) == 0 and i + mask < n:
            return _round((RECV_COPY, i + mask, chunks(i + mask, mask)))
        return []

    def broadcast(mask: int) -> Round:
        if i % (2 * mask) == mask:
            return _round((RECV_COPY, i - mask, chunks(0, n)))
        if i % (2 * mask) == 0 and i + mask < n:
            return _round((SEND, i + mask, chunks(0, n)))
        return []

    return [gather(m) for m in masks] + [broadcast(m) for m in reversed(masks)]


GATHERS: dict[str, Callable[[int, int, int], Schedule]] = {
    "ring": ring_gather_schedule,
    "reduce-broadcast": gather_broadcast_schedule,
    "tree": tree_gather_schedule,
}
