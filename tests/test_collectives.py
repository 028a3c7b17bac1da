"""All-reduce schedules: run against each other in one process, then in real Gloo processes."""

from __future__ import annotations

import functools
import random
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from hypothesis import given, settings
from hypothesis import strategies as st

from polyrhythm.comm.collectives import all_reduce, early_sends, schedule_steps
from polyrhythm.comm.transport import Transport
from polyrhythm.layout import (
    ALGORITHMS,
    GATHERS,
    RECV_ADD,
    RECV_COPY,
    RING_SEGMENT_NUMEL,
    SEND,
    Op,
    ring_schedule,
    shard_ranges,
)

NAMES = list(ALGORITHMS)
SEGMENTED = "ring, 3 segments"
# Every schedule, and the ring as it runs on large tensors: each chunk in several segments.
SCHEDULES = {**ALGORITHMS, SEGMENTED: functools.partial(ring_schedule, segments=3)}
SPAWN_TIMEOUT_S = 240.0
BYTES_NUMEL = 60 * 1024  # divisible by 2..6: the traffic analysis is exact


def sizes(n: int) -> list[int]:
    """Empty, smaller than N, not divisible by N, and large."""
    return sorted({0, 1, max(n - 1, 1), n + 1, 1000 + 3})


# --- every member in one process, round by round ---------------------------------------------


class _Done:
    def wait(self) -> None:
        pass


class _Arrival:
    """A posted receive: takes its message off the fake wire when waited for."""

    def __init__(self, wire: dict, key: tuple[int, int, int], tensor: torch.Tensor) -> None:
        self.wire, self.key, self.tensor = wire, key, tensor

    def wait(self) -> None:
        message = self.wire[self.key].popleft()
        assert message.numel() == self.tensor.numel(), f"size mismatch on {self.key}"
        self.tensor.copy_(message)


class FakeTransport(Transport):
    """The Transport itself (its counting included) over an in-memory wire shared by all
    members: a send is a copy taken when it is posted, a receive takes the oldest message of
    its (src, dst, tag) when it is waited for."""

    def __init__(self, wire: dict, rank: int) -> None:
        super().__init__()
        self.wire, self.rank = wire, rank

    def _post_send(self, tensor: torch.Tensor, dst: int, tag: int) -> _Done:
        self.wire[self.rank, dst, tag].append(tensor.clone())
        return _Done()

    def _post_receive(self, tensor: torch.Tensor, src: int, tag: int) -> _Arrival:
        return _Arrival(self.wire, (src, self.rank, tag), tensor)


def simulate(algorithm: str | Callable, tensors: list[torch.Tensor],
             ranks: list[int] | None = None) -> list[FakeTransport]:
    """All-reduce `tensors` (one per member, in place) with the real executor, all members in
    lockstep: every member posts round r (its receives all went first; sends of round r+1
    may go early), then every member waits for round r. A receive whose message nobody has
    sent yet fails the test."""
    ranks = ranks or list(range(len(tensors)))
    wire: dict = defaultdict(deque)
    transports = [FakeTransport(wire, rank) for rank in ranks]
    schedule = SCHEDULES[algorithm] if isinstance(algorithm, str) else algorithm
    members = [schedule_steps(transports[i], t, schedule(len(ranks), i, t.numel()), ranks)
               for i, t in enumerate(tensors)]
    while members:
        members = [m for m in members if next(m, None) is not None]
    assert not any(wire.values()), "messages sent but never received"
    return transports


def integer_tensors(n: int, numel: int, seed: int = 0) -> list[torch.Tensor]:
    """Small integers as float32: every summation order gives the exact sum."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-1000, 1000, (numel,), generator=gen).float() for _ in range(n)]


def assert_all_reduced(algorithm: str, n: int, numel: int, seed: int = 0) -> None:
    tensors = integer_tensors(n, numel, seed)
    expected = torch.stack(tensors).sum(0)
    simulate(algorithm, tensors)
    for t in tensors:
        assert torch.equal(t, expected)


@pytest.mark.parametrize("algorithm", SCHEDULES)
@pytest.mark.parametrize("n", range(1, 9))
def test_every_member_ends_with_the_exact_sum(algorithm, n):
    for numel in sizes(n):
        assert_all_reduced(algorithm, n, numel, seed=numel)


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(list(SCHEDULES)), n=st.integers(1, 13), numel=st.integers(0, 300),
       seed=st.integers(0, 2**16))
def test_all_reduce_sums_for_any_member_count_and_size(algorithm, n, numel, seed):
    assert_all_reduced(algorithm, n, numel, seed)


@pytest.mark.parametrize("algorithm", NAMES)
def test_float_sums_are_bit_identical_on_every_member(algorithm):
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(1237, generator=gen) * 10 ** float(k) for k in range(7)]
    reference = torch.stack(tensors).double().sum(0)
    simulate(algorithm, tensors)
    for t in tensors[1:]:
        assert torch.equal(t, tensors[0])
    assert torch.allclose(tensors[0].double(), reference, rtol=1e-5, atol=1e-3)


class _Landed(threading.Event):
    """A send or receive on the threaded wire, done once its message has landed."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.tensor = tensor

    def wait(self, timeout: float = 30.0) -> bool:
        assert super().wait(timeout), "a message never landed"
        return True


class ThreadedTransport(Transport):
    """A member on a thread of its own, posting with jitter, over a wire where a message lands
    as soon as both its send and its receive are posted, reading the sender's tensor then: as
    early as Gloo may land it, however far ahead the receive was posted."""

    def __init__(self, wire: dict, rank: int) -> None:
        super().__init__()
        self.wire, self.rank, self.rng = wire, rank, random.Random(rank)

    def _post(self, key: tuple[int, int, int], tensor: torch.Tensor, sending: bool) -> _Landed:
        time.sleep(self.rng.random() * 1e-3)
        mine = _Landed(tensor)
        with self.wire["lock"]:
            posted = self.wire[key]  # the unmatched posts of one side, oldest first
            if not posted or posted[0][0] == sending:
                posted.append((sending, mine))
                return mine
            theirs = posted.popleft()[1]
        sent, received = (mine, theirs) if sending else (theirs, mine)
        received.tensor.copy_(sent.tensor)
        sent.set(), received.set()
        return mine

    def _post_send(self, tensor: torch.Tensor, dst: int, tag: int) -> _Landed:
        return self._post((self.rank, dst, tag), tensor, True)

    def _post_receive(self, tensor: torch.Tensor, src: int, tag: int) -> _Landed:
        return self._post((src, self.rank, tag), tensor, False)


def on_threads(schedule: Callable, tensors: list[torch.Tensor], size: int) -> None:
    """Every member's schedule (of `size`) on its tensor, each member on a thread."""
    wire, ranks = defaultdict(deque, lock=threading.Lock()), list(range(len(tensors)))
    with ThreadPoolExecutor(len(tensors)) as pool:
        for run in [pool.submit(deque, schedule_steps(ThreadedTransport(wire, i), t,
                                                      schedule(len(ranks), i, size), ranks), 0)
                    for i, t in enumerate(tensors)]:
            run.result()


@pytest.mark.parametrize("algorithm", [*SCHEDULES, *(f"gather {a}" for a in GATHERS)])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_members_on_threads_agree_when_messages_land_early(algorithm, n):
    """Receives go rounds ahead: wherever their data lands, every member ends with the exact
    sum (an all-gather: every member's chunk), bit for bit."""
    size, tensors = 203 * n, integer_tensors(n, 203 * n, seed=n)
    if algorithm.startswith("gather "):
        expected = torch.cat(tensors)
        tensors = [torch.zeros(n * size).index_copy_(0, torch.arange(i * size, (i + 1) * size),
                                                     t) for i, t in enumerate(tensors)]
        on_threads(GATHERS[algorithm.removeprefix("gather ")], tensors, size)
    else:
        expected = torch.stack(tensors).sum(0)
        on_threads(SCHEDULES[algorithm], tensors, size)
    for t in tensors:
        assert torch.equal(t, expected)


@pytest.mark.parametrize("algorithm", NAMES)
def test_members_are_global_ranks_in_the_given_order(algorithm):
    """Members need not be 0..N-1 (e.g. workers after the servers); the list fixes the order."""
    tensors = integer_tensors(4, 11)
    expected = torch.stack(tensors).sum(0)
    transports = simulate(algorithm, tensors, ranks=[7, 2, 9, 4])
    for t in tensors:
        assert torch.equal(t, expected)
    assert all(t.counters.messages_sent > 0 for t in transports[1:])


@pytest.mark.parametrize("algorithm", SCHEDULES)
@pytest.mark.parametrize("n", range(1, 10))
def test_sends_and_receives_match_up_and_never_race(algorithm, n):
    """In every round, each send from i to j has a receive on j from i of the same size, and a
    member never overwrites a range it is sending in the same round."""
    for numel in sizes(n):
        schedules = [SCHEDULES[algorithm](n, i, numel) for i in range(n)]
        for r in range(max(map(len, schedules), default=0)):
            rounds = [s[r] if r < len(s) else [] for s in schedules]
            sends = Counter((i, op.peer, op.numel) for i, ops in enumerate(rounds)
                            for op in ops if op.op == SEND)
            receives = Counter((op.peer, i, op.numel) for i, ops in enumerate(rounds)
                               for op in ops if op.op in (RECV_ADD, RECV_COPY))
            assert sends == receives, (algorithm, n, numel, r)
            pairs = [(i, op.peer, op.op == SEND) for i, ops in enumerate(rounds) for op in ops]
            assert len(pairs) == len(set(pairs)), "two messages one way between two members"
            for ops in rounds:
                assert all(0 <= op.start < op.stop <= numel and op.peer in range(n)
                           for op in ops)
                sent = [op for op in ops if op.op == SEND]
                written = [op for op in ops if op.op == RECV_COPY]
                assert not any(a.start < b.stop and b.start < a.stop
                               for a in written for b in sent + written if a is not b)


def test_early_sends_skip_ranges_the_round_in_flight_writes():
    current = [Op(SEND, 1, 0, 5), Op(RECV_ADD, 2, 5, 10), Op(RECV_COPY, 3, 20, 30)]
    upcoming = [Op(RECV_COPY, 0, 10, 12), Op(SEND, 1, 0, 5), Op(SEND, 2, 8, 12),
                Op(SEND, 3, 25, 26), Op(SEND, 0, 12, 20)]
    assert early_sends(current, upcoming) == [Op(SEND, 1, 0, 5), Op(SEND, 0, 12, 20)]


@pytest.mark.parametrize("n", range(3, 8))
def test_ring_pipelines_segments(n):
    """Unsegmented, no send goes a round early (it sends the chunk just received); with
    segments, every send does, so one segment travels while another is added."""
    for i in range(n):
        for segments in (1, 2, 3):
            schedule = ring_schedule(n, i, 1003, segments)
            for current, upcoming in zip(schedule, schedule[1:], strict=False):
                sends = [op for op in upcoming if op.op == SEND]
                assert early_sends(current, upcoming) == (sends if segments > 1 else [])


def test_ring_rounds_and_chunks():
    """2(N-1) rounds, one chunk out and one in per round; chunks differ by at most one; large
    chunks are split into segments of RING_SEGMENT_NUMEL elements or more."""
    for n, numel in [(2, 10), (5, 1003), (7, 3)]:
        bounds = shard_ranges(numel, n)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
        for i in range(n):
            schedule = ring_schedule(n, i, numel)
            assert len(schedule) == 2 * (n - 1)
            assert all(len(ops) <= 2 for ops in schedule)
            assert len(ring_schedule(n, i, numel, segments=3)) == 6 * (n - 1)
    assert ring_schedule(1, 0, 100) == []
    assert len(ring_schedule(4, 0, 4 * RING_SEGMENT_NUMEL - 1)) == 6
    big = ring_schedule(4, 0, 4 * 2 * RING_SEGMENT_NUMEL + 5)
    assert len(big) == 12 and min(op.numel for ops in big for op in ops) >= RING_SEGMENT_NUMEL


@pytest.mark.parametrize("segments", [2, 5])
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_segmented_ring_moves_the_same_bytes(n, segments):
    for numel in sizes(n) + [2 * n * segments + 1]:
        segmented = simulate(functools.partial(ring_schedule, segments=segments),
                             integer_tensors(n, numel))
        assert [(t.counters.bytes_sent, t.counters.bytes_received) for t in segmented] == \
            bytes_by_member("ring", n, numel)


def test_tree_takes_logarithmic_rounds():
    for n in (2, 3, 4, 5, 8, 9):
        depth = (n - 1).bit_length()
        assert {len(ALGORITHMS["tree"](n, i, 10)) for i in range(n)} == {2 * depth}


def test_unknown_algorithm_is_an_error_and_one_member_keeps_its_values():
    with pytest.raises(ValueError, match="ring"):
        all_reduce(Transport(), torch.zeros(3), [0], 0, "butterfly")
    for algorithm in NAMES:
        t = torch.arange(5.0)
        all_reduce(Transport(), t, [3], 3, algorithm)  # no process group needed: no message
        assert torch.equal(t, torch.arange(5.0))


def bytes_by_member(algorithm: str, n: int, numel: int = BYTES_NUMEL) -> list[tuple[int, int]]:
    transports = simulate(algorithm, [torch.ones(numel) for _ in range(n)])
    return [(t.counters.bytes_sent, t.counters.bytes_received) for t in transports]


@pytest.mark.parametrize("n", range(2, 6))
def test_ring_traffic_per_member_is_flat_in_n(n):
    size = BYTES_NUMEL * 4
    traffic = bytes_by_member("ring", n)
    assert len(set(traffic)) == 1, "every member moves the same bytes"
    sent, received = traffic[0]
    assert sent == received
    assert abs(sent - 2 * (n - 1) / n * size) <= 0.01 * size
    assert sent <= 2 * bytes_by_member("ring", 2)[0][0]


@pytest.mark.parametrize("n", range(2, 6))
def test_reduce_broadcast_root_traffic_grows_linearly(n):
    size = BYTES_NUMEL * 4
    root, *others = bytes_by_member("reduce-broadcast", n)
    assert root == ((n - 1) * size, (n - 1) * size)
    assert set(others) == {(size, size)}


@pytest.mark.parametrize("n", range(2, 6))
def test_tree_root_traffic_is_logarithmic(n):
    size = BYTES_NUMEL * 4
    root, *_ = bytes_by_member("tree", n)
    assert root == ((n - 1).bit_length() * size, (n - 1).bit_length() * size)


# --- real processes over Gloo ------------------------------------------------------------------
#
# One spawn of WORLD processes serves every N: the members of an N-process all-reduce are the
# first N ranks (Gloo's own all-reduce runs on a group of the same ranks), so the processes
# start once, and the rest of the world idling meanwhile is the case of a job whose servers
# take no part in the workers' all-reduce.

WORLD = 6


def _member(rank: int, init_method: str, out: str) -> None:
    """One spawned process: for every N, every algorithm on every size next to Gloo's own."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        results: dict = {}
        for n in range(2, WORLD + 1):
            ranks = list(range(n))
            group = dist.new_group(ranks)  # every rank takes part in creating it
            if rank not in ranks:
                continue
            gen = torch.Generator().manual_seed(100 * n + rank)
            for numel in sorted({1, n - 1, 1237}):
                x = torch.randn(numel, generator=gen)
                native = x.clone()
                dist.all_reduce(native, group=group)
                results[n, "native", numel] = native
                for algorithm in NAMES:
                    y = x.clone()
                    all_reduce(Transport(), y, ranks, rank, algorithm)
                    results[n, algorithm, numel] = y
                y = x.clone()  # the pipelined ring, its segments posted a round early
                schedule = SCHEDULES[SEGMENTED](n, rank, numel)
                for _ in schedule_steps(Transport(), y, schedule, ranks):
                    pass
                results[n, SEGMENTED, numel] = y
            for algorithm in NAMES:
                transport = Transport()
                all_reduce(transport, torch.ones(BYTES_NUMEL), ranks, rank, algorithm)
                counters = transport.counters
                results[n, "traffic", algorithm] = (counters.bytes_sent, counters.bytes_received)
        members = [5, 3, 1]  # not from 0, not in rank order
        if rank in members:
            for algorithm in NAMES:
                y = (torch.arange(12.0).reshape(3, 4) * rank).t()  # not contiguous
                all_reduce(Transport(), y, members, rank, algorithm)
                results["subset", algorithm] = y
        torch.save(results, Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


@functools.cache
def run_world() -> list[dict]:
    """Spawn the WORLD Gloo processes once; return what each rank stored."""
    with tempfile.TemporaryDirectory(prefix="polyrhythm-collectives-") as out:
        context = tmp.start_processes(_member, args=(f"file://{out}/store", out), nprocs=WORLD,
                                      join=False, start_method="spawn")
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError("all-reduce processes still running")
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
                p.join()
        return [torch.load(Path(out) / f"{rank}.pt") for rank in range(WORLD)]


@pytest.mark.parametrize("n", range(2, WORLD + 1))
def test_processes_agree_with_gloo_all_reduce(n):
    members = run_world()[:n]
    for numel in sorted({1, n - 1, 1237}):
        native = members[0][n, "native", numel]
        for algorithm in [*NAMES, SEGMENTED]:
            ours = [m[n, algorithm, numel] for m in members]
            for other in ours[1:]:
                assert torch.equal(other, ours[0]), f"{algorithm} differs between ranks"
            error = (ours[0] - native).norm() / native.norm()
            assert error <= 1e-6, (algorithm, numel, error.item())


@pytest.mark.parametrize("n", range(2, WORLD))
def test_processes_move_the_predicted_bytes(n):
    size = BYTES_NUMEL * 4
    members = run_world()[:n]
    ring = [m[n, "traffic", "ring"] for m in members]
    assert len(set(ring)) == 1, "every rank moves the same bytes"
    sent, received = ring[0]
    assert sent == received and abs(sent - 2 * (n - 1) / n * size) <= 0.01 * size
    assert sent <= 2 * run_world()[0][2, "traffic", "ring"][0]
    root, *others = (m[n, "traffic", "reduce-broadcast"] for m in members)
    assert root == ((n - 1) * size, (n - 1) * size)
    assert set(others) == {(size, size)}


def test_processes_reduce_over_any_subset_in_any_order_and_any_layout():
    world = run_world()
    expected = (torch.arange(12.0).reshape(3, 4) * 9).t()
    for algorithm in NAMES:
        for rank in (5, 3, 1):
            assert torch.equal(world[rank]["subset", algorithm], expected)
