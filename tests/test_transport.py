"""The transport over real Gloo, two processes: a peer killed is lost, a silent one times out,
any other error keeps its type; bytes are counted when a receive completes, and the counters a
resource sampler reads keep moving after an uncounted window. Three: the survivors of a rank
lost go on in a group of their own."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from polyrhythm.comm.faults import PeerLost, PeerSilent, translated
from polyrhythm.comm.network_threads import LOOP_THREAD, LOWEST
from polyrhythm.comm.transport import WORKERS, WORLD, Transport
from polyrhythm.launch import forkserver
from polyrhythm.metrics.sampler import ResourceSampler

GO, DATA, BEFORE, WINDOW, AFTER = 1, 2, 3, 4, 5  # tags
SILENCE_S = 3  # the process group's timeout in the timeout scenario


def _outcome(exc: BaseException | None, **seen) -> dict:
    if exc is None:
        return {"raised": None, **seen}
    return {"raised": type(exc).__name__, "rank": getattr(exc, "rank", "-"),
            "message": str(exc), **seen}


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _counted_on_completion(rank: int, transport: Transport) -> dict:
    """Rank 1 sends only once rank 0 says go, after rank 0 has posted its receive."""
    if rank == 1:
        transport.irecv(torch.empty(1), 0, tag=GO).wait()
        transport.isend(torch.ones(4), 0, tag=DATA).wait()
        return {}
    buffer = torch.empty(4)
    pending = transport.irecv(buffer, 1, tag=DATA)
    posted = transport.counters.snapshot()
    transport.isend(torch.ones(1), 1, tag=GO).wait()
    pending.wait()
    pending.wait()  # waited for twice, counted once
    return {"posted": posted, "completed": transport.counters.snapshot(),
            "values": buffer.tolist()}


def _sampled_through_a_window(rank: int, transport: Transport) -> dict:
    """4, 8 (uncounted) and 2 floats from rank 0 to rank 1, while rank 0's sampler runs on
    the counters' `moved`, as a job's does (runtime/job.py)."""
    sizes = {BEFORE: 4, WINDOW: 8, AFTER: 2}
    if rank == 1:
        for tag, numel in sizes.items():
            transport.irecv(torch.empty(numel), 0, tag=tag).wait()
            if tag == WINDOW:
                transport.all_reduce(torch.ones(numel), WORLD)
        return {}
    with ResourceSampler(0, "worker", time.monotonic, transport.counters.moved,
                         interval_s=3600) as sampler:
        transport.isend(torch.ones(sizes[BEFORE]), 1, tag=BEFORE).wait()
        with transport.uncounted():
            transport.isend(torch.ones(sizes[WINDOW]), 1, tag=WINDOW).wait()
            transport.all_reduce(torch.ones(sizes[WINDOW]), WORLD)
        transport.isend(torch.ones(sizes[AFTER]), 1, tag=AFTER).wait()
    *_, sent, _ = sampler.samples[-1]
    return {"sampled_sent": sent, "traffic": transport.counters.snapshot()}


def _peer_killed(rank: int, transport: Transport, how: str) -> dict:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        if how == "receive":
            transport.irecv(torch.empty(4), 1).wait()
        elif how == "receiver":
            transport.receiver([1], 4).take()
        else:
            transport.all_reduce(torch.ones(4), WORLD)
    except Exception as exc:  # noqa: BLE001 - what it was is the outcome
        return _outcome(exc)
    return _outcome(None)


def _silent_peer(rank: int, transport: Transport, out: Path) -> dict:
    if rank == 1:  # alive, sending nothing, until rank 0 has its outcome
        _wait_for(out / "0.json")
        return {}
    try:
        transport.receiver([1], 4).take()
    except Exception as exc:  # noqa: BLE001
        return _outcome(exc)
    return _outcome(None)


def _a_bug_in_a_receive(rank: int, transport: Transport) -> dict:
    """A receiver whose `last` (gossip's test for a peer's last message) has a bug."""
    if rank == 1:
        transport.isend(torch.ones(4), 0).wait()
        transport.irecv(torch.empty(1), 0, tag=GO).wait()  # alive until rank 0 is done
        return {}

    def last(message: torch.Tensor) -> bool:
        raise ValueError("a bug in last()")

    receiver = transport.receiver([1], 4, last=last)
    try:
        receiver.take()  # the message, queued before last() looks at it
        receiver.take()
    except Exception as exc:  # noqa: BLE001
        return _outcome(exc)
    finally:
        transport.isend(torch.ones(1), 1, tag=GO).wait()
    return _outcome(None)


def _longer_than_its_receive(rank: int, transport: Transport) -> dict:
    if rank == 1:
        transport.isend(torch.ones(10), 0).wait()
        try:
            transport.irecv(torch.empty(1), 0, tag=GO).wait()  # rank 0 never answers
        except Exception as exc:  # noqa: BLE001
            return _outcome(exc)
        return _outcome(None)
    transport.receiver([1], 8).take()  # Gloo aborts this process
    return {"survived": True}


def _network_priorities(transport: Transport) -> dict:
    """The nice values of this process's Gloo loop threads, after the default group's set-up
    and after a second group's (WORKERS here: ranks 0 and 1 of a world of 2 are the world,
    so a group of one other name, made as exclude() makes it)."""
    def nices() -> list[int]:
        found = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() == LOOP_THREAD:
                    found.append(os.getpriority(os.PRIO_PROCESS, int(tid)))
        return sorted(found)
    first = nices()
    transport.exclude(set())  # the world made again as a group of its own: its own thread
    transport.all_reduce(torch.ones(2), WORLD)
    return {"first": first, "then": nices(), "main": os.getpriority(os.PRIO_PROCESS, 0)}


def _survivors_regroup(rank: int, transport: Transport) -> dict:
    """Ranks 1 and 2 (the workers) meet in WORKERS' group, which rank 0 (a server) never
    makes, so the survivors have made different numbers of groups; rank 2 dies."""
    if rank > 0:
        transport.all_reduce(torch.ones(1), WORKERS)
    transport.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    transport.exclude({2})
    total = torch.ones(1)
    transport.all_reduce(total, WORLD)
    return {"total": total.item()}


def _rank(rank: int, scenario: str, out: str, timeout_s: float, world: int) -> None:
    out = Path(out)
    if scenario.startswith("priorities"):  # both ranks on one core, or one core each
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        os.environ["LOCAL_WORLD_SIZE"] = "2" if scenario.endswith("shared") else "1"
    dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    transport = Transport()
    transport.open(rank, world, list(range(world - 2, world)))
    transport.barrier()
    name, _, how = scenario.partition(":")
    plays = {"counted": lambda: _counted_on_completion(rank, transport),
             "sampled": lambda: _sampled_through_a_window(rank, transport),
             "killed": lambda: _peer_killed(rank, transport, how),
             "silent": lambda: _silent_peer(rank, transport, out),
             "bug": lambda: _a_bug_in_a_receive(rank, transport),
             "longer": lambda: _longer_than_its_receive(rank, transport),
             "priorities": lambda: _network_priorities(transport),
             "regroup": lambda: _survivors_regroup(rank, transport)}
    result = plays[name]()
    (out / f"{rank}.json.tmp").write_text(json.dumps(result))
    os.replace(out / f"{rank}.json.tmp", out / f"{rank}.json")
    os._exit(0)  # no teardown of a group whose peer may be dead


def pair(tmp_path: Path, scenario: str, timeout_s: float = 60,
         world: int = 2) -> tuple[list, list[int]]:
    """Run `scenario` on ranks 0 and 1 (or `world` ranks, the last two its workers); (what
    each wrote, None if nothing; exit codes)."""
    ctx = forkserver.context()
    procs = [ctx.Process(target=_rank, args=(r, scenario, str(tmp_path), timeout_s, world))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
            p.join()
    results = [json.loads((tmp_path / f"{r}.json").read_text())
               if (tmp_path / f"{r}.json").exists() else None for r in range(world)]
    return results, [p.exitcode for p in procs]


def test_a_posted_receive_is_counted_when_it_completes(tmp_path):
    (got, _), codes = pair(tmp_path, "counted")
    assert codes == [0, 0]
    assert got["posted"]["bytes_received"] == 0 and got["posted"]["messages_received"] == 0
    assert got["completed"]["bytes_received"] == 16
    assert got["completed"]["messages_received"] == 1
    assert got["values"] == [1.0] * 4


def test_the_sampled_counters_keep_moving_after_an_uncounted_window(tmp_path):
    (got, _), codes = pair(tmp_path, "sampled")
    assert codes == [0, 0]
    # 4 floats before the window and 2 after: 24 bytes, the 8 floats inside left out.
    assert got["traffic"]["bytes_sent"] == 24 and got["traffic"]["messages_sent"] == 2
    assert got["traffic"]["native_collective_bytes"] == 0
    assert got["sampled_sent"] == 24


@pytest.mark.parametrize("how", ["receive", "receiver", "all_reduce"])
def test_a_peer_killed_mid_receive_is_lost(tmp_path, how):
    (got, dead), codes = pair(tmp_path, f"killed:{how}")
    assert codes == [0, -signal.SIGKILL] and dead is None
    assert got["raised"] == "PeerLost", got
    assert got["rank"] == (None if how == "all_reduce" else 1)
    assert "is gone: " in got["message"]


def test_survivors_meet_in_a_group_of_their_own_whatever_groups_each_had_made(tmp_path):
    """torch names a group after its ranks and how many groups the process has: unless the
    groups that held the lost rank are dropped, the server and the worker left wait for
    each other under different names, until pair gives up on them."""
    got, codes = pair(tmp_path, "regroup", timeout_s=20, world=3)
    assert codes == [0, 0, -signal.SIGKILL]
    assert got[:2] == [{"total": 2.0}, {"total": 2.0}]


def test_a_peer_that_sends_nothing_within_the_timeout_is_silent(tmp_path):
    (got, _), codes = pair(tmp_path, "silent", timeout_s=SILENCE_S)
    assert codes == [0, 0]
    assert got["raised"] == "PeerSilent" and got["rank"] == 1, got
    assert got["message"].startswith("rank 1 sent nothing within the timeout: ")


def test_a_bug_in_a_receive_keeps_its_type_and_is_no_lost_peer(tmp_path):
    (got, _), codes = pair(tmp_path, "bug")
    assert codes == [0, 0]
    assert got == {"raised": "ValueError", "rank": "-", "message": "a bug in last()"}


def test_a_message_longer_than_its_receive_aborts_the_receiver_whose_peer_sees_it_gone(
        tmp_path):
    # Gloo raises nothing for a size mismatch: it aborts the receiving process (a crash, not
    # a lost peer: launch/failures.py), and its peers then see a closed connection.
    (dead, got), codes = pair(tmp_path, "longer")
    assert codes == [-signal.SIGABRT, 0] and dead is None
    assert got["raised"] == "PeerLost" and got["rank"] == 0, got


def test_only_a_closed_connection_or_a_timeout_is_read_as_a_peer_fault():
    closed = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:32653. This is "
                          "typically caused by a remote worker crashing.")
    reset = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:27300: Connection reset by peer")
    timed_out = RuntimeError("[unbound_buffer.cc:78] Timed out waiting 3000ms for recv "
                             "operation to complete")
    for cause, kind in ((closed, PeerLost), (reset, PeerLost), (timed_out, PeerSilent)):
        ours = translated(cause, 3)
        assert type(ours) is kind and ours.rank == 3 and ours.__cause__ is cause
    for other in (RuntimeError("input tensor has to be contiguous"), ValueError("timed out"),
                  KeyError("Connection closed by peer")):
        assert translated(other, 3) is other


@pytest.mark.parametrize("cores", ["shared", "own"])
def test_gloo_network_threads_yield_only_on_a_shared_core(tmp_path, cores):
    """Ranks that outnumber their cores run Gloo's loop threads at the lowest priority (every
    group's, made later too: comm/network_threads.py); a rank with a core of its own leaves
    them as they are."""
    got, codes = pair(tmp_path, f"priorities:{cores}")
    assert codes == [0, 0]
    for rank in got:
        want = LOWEST if cores == "shared" else rank["main"]  # as the process's other threads
        assert rank["first"] == [want]
        assert rank["then"] == [want, want]
