"""All-reduce over point-to-point messages: ring, binomial tree and reduce-broadcast.

Every algorithm is a *schedule* (layout.py, where the simulator reads them too): a pure
function of (members N, my index i, numel) returning a list of rounds, each a list of
`Op(op, peer, start, stop)` on the index range [start, stop) of the flattened tensor. One
executor runs any schedule over the `Transport`, so every byte is counted in the one place
all point-to-point messages go through, and the schedules themselves can be checked without
processes (the tests run all members' schedules against each other in one process, in
lockstep and on threads of their own).

The executor posts every receive of the schedule before its first send (a late receive costs
Gloo a round trip: it holds a send until the receiver's ready-to-receive notice arrives, and a
receive posted while data is arriving contends with Gloo's network thread), then per round its
sends (and those of the next round that may go early), waits for the round's messages, and only
then applies the received data: `recv_copy` lands straight in the tensor, `recv_add` in a place
of its own in a scratch buffer, added afterwards. A schedule therefore never writes a range it
sends in the same round (a send buffer must not change while in flight), which the tests check.
A receive posted rounds early may land whenever its sender sends; for a `recv_copy` that is
safe because what a member receives by copy is a result that depends on everything the member
did to that range before (its adds applied, its sends of the range received), so it cannot
arrive sooner. Zero-length ranges are left out of a schedule on both sides, so tensors smaller
than N and sizes that N does not divide need no special case.

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

import functools
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

from polyrhythm.comm.transport import Pending, Transport
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
# Compiled schedules kept, by (algorithm, N, member, size): a job all-reduces a few sizes.
PLANS_KEPT = 64
# Scratch buffers kept between calls, by (dtype, numel): a buffer per message and call cost
# page faults on every call (16 MiB, 4 processes: 2,000 a call). The ring keeps (N-1)/N of
# the tensor so, the reduce-broadcast root N-1 tensors; a few sizes only, so that a job that
# all-reduces ever-new sizes (compressed messages) holds no more than a few.
SCRATCH_KEPT = 4
# How a message of a schedule is waited for, where not by its own wait (comm/membership.py).
Wait = Callable[[Pending], None]


def _overlaps(op: Op, ops: Iterable[Op]) -> bool:
    return any(op.start < other.stop and other.start < op.stop for other in ops)


def early_sends(current: Round, upcoming: Round) -> Round:
    """The sends of the next non-empty round that may be posted while `current` is in flight:
    those of a range `current` does not write (receives are all posted up front). In the
    segmented ring that is every send, so one segment travels while the previous one is added;
    unsegmented, none (the ring sends on the chunk it has just received)."""
    written = [op for op in current if op.op != SEND]
    return [op for op in upcoming if op.op == SEND and not _overlaps(op, written)]


class _Plan:
    """One member's schedule turned into what the executor does, once per schedule: its
    messages numbered (receives first, in round order), the sends to post in each round (its
    own not posted early, then those of the next non-empty round that may go early), the
    messages to wait for in each round, and its adds, each with its place in one scratch
    buffer of `scratch_numel` values."""

    def __init__(self, schedule: Schedule) -> None:
        self.rounds = len(schedule)
        self.receives: list[tuple[int, Op, int]] = []  # (round, op, scratch offset)
        self.sends: list[list[tuple[int, int, Op]]] = [[] for _ in schedule]  # (no, round, op)
        self.waits: list[list[int]] = [[] for _ in schedule]
        self.adds: list[list[tuple[Op, int]]] = [[] for _ in schedule]
        self.scratch_numel = 0
        for r, ops in enumerate(schedule):
            for op in ops:
                if op.op == SEND:
                    continue
                offset = self.scratch_numel  # a recv_copy's: unused
                if op.op == RECV_ADD:
                    self.adds[r].append((op, offset))
                    self.scratch_numel += op.numel
                self.waits[r].append(len(self.receives))
                self.receives.append((r, op, offset))
        self.messages = len(self.receives)
        busy = [r for r, ops in enumerate(schedule) if ops]
        went_early: Round = []
        for r, nxt in zip(busy, [*busy[1:], None], strict=False):  # None: the last
            own = [op for op in schedule[r] if op.op == SEND and op not in went_early]
            went_early = [] if nxt is None else early_sends(schedule[r], schedule[nxt])
            for at, ops in ((r, own), (nxt, went_early)):
                for op in ops:
                    self.sends[r].append((self.messages, at, op))
                    self.waits[at].append(self.messages)
                    self.messages += 1


@functools.lru_cache(maxsize=PLANS_KEPT)
def _planned(gather: bool, algorithm: str, n: int, i: int, size: int) -> _Plan:
    return _Plan((GATHERS if gather else ALGORITHMS)[algorithm](n, i, size))


_scratch: dict[tuple[torch.dtype, int], torch.Tensor] = {}  # oldest first
_scratch_lock = threading.Lock()


def _take_scratch(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A kept buffer, taken out while in use (a call on another thread makes its own)."""
    with _scratch_lock:
        kept = _scratch.pop((dtype, numel), None)
    return kept if kept is not None else torch.empty(numel, dtype=dtype)


def _keep_scratch(buffer: torch.Tensor) -> None:
    with _scratch_lock:
        _scratch[buffer.dtype, buffer.numel()] = buffer
        while len(_scratch) > SCRATCH_KEPT:
            del _scratch[next(iter(_scratch))]


def schedule_steps(transport: Transport, flat: torch.Tensor, schedule: Schedule,
                   ranks: list[int]) -> Iterator[int]:
    """Run one member's schedule on a flat contiguous tensor (peers are indices into `ranks`),
    yielding once per round r after posting it and before waiting for it: all_reduce runs the
    steps through; the tests interleave all members' steps in one process."""
    return _steps(transport, flat, _Plan(schedule), ranks)


def _steps(transport: Transport, flat: torch.Tensor, plan: _Plan, ranks: list[int],
           tags: int = TAG_BASE, wait: Wait | None = None,
           posted: list[Pending] | None = None) -> Iterator[int]:
    """Round r's messages carry tag TAG_BASE + r. Every receive is posted first, then each
    round posts its sends, waits for its messages and applies its adds in schedule order.

    Measured on 2 cores, 4 processes, ring against Gloo's all-reduce: posting the receives a
    round ahead only (as before) gave 1.45-2.45x at 1 MiB, two or three rounds ahead
    1.05-1.4x, all of them first 0.8-1.25x (the spread is the shared machine's). Sends are
    still waited for in their round: letting them run on to the end measured no faster, and
    it keeps what is in flight to two rounds' sends.

    `tags`: round r's tag is `tags` + r (a group whose members change gives each generation
    tags of its own); `wait`: how each message is waited for (its own watch on the members);
    `posted`: where every message posted is kept too (one abandoned mid-way must outlive its
    posting: Gloo may still read into or out of its buffer).
    """
    scratch = _take_scratch(flat.dtype, plan.scratch_numel) if plan.scratch_numel else None
    pending: list = [None] * plan.messages
    if posted is not None:
        posted.append(pending)  # filled in as they are posted
    for k, (r, op, offset) in enumerate(plan.receives):
        into = (flat[op.start:op.stop] if op.op == RECV_COPY
                else scratch[offset:offset + op.numel])
        pending[k] = transport.irecv(into, ranks[op.peer], tags + r)
    for r in range(plan.rounds):
        for k, at, op in plan.sends[r]:
            pending[k] = transport.isend(flat[op.start:op.stop], ranks[op.peer], tags + at)
        yield r
        for k in plan.waits[r]:
            if wait is None:
                pending[k].wait()
            else:
                wait(pending[k])
        for op, offset in plan.adds[r]:
            flat[op.start:op.stop].add_(scratch[offset:offset + op.numel])
    if scratch is not None:
        _keep_scratch(scratch)  # not after a failure: a receive posted into it may still land


def all_reduce(transport: Transport, tensor: torch.Tensor, ranks: list[int], rank: int,
               algorithm: str, tags: int = TAG_BASE, wait: Wait | None = None,
               posted: list | None = None) -> None:
    """Sum `tensor` in place over the processes `ranks` (global ranks, the same list in the
    same order on every member; `rank` is this process's), leaving identical bits on all.
    `tags`, `wait` and `posted`: as _steps takes them."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"known: {', '.join(ALGORITHMS)}")
    plan = _planned(False, algorithm, len(ranks), ranks.index(rank), tensor.numel())
    if not plan.rounds:
        return
    contiguous = tensor.is_contiguous()
    flat = (tensor if contiguous else tensor.contiguous()).view(-1)
    for _ in _steps(transport, flat, plan, ranks, tags, wait, posted):
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
    for _ in _steps(transport, rows.view(-1), _planned(True, algorithm, n, me, size), ranks):
        pass
    return rows
