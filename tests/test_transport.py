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
from polyrhythm.launch.process import forkserver
from polyrhythm.metrics.sampler import ResourceSampler

GO, DATA, BEFORE, WINDOW, AFTER = 1, 2, 3, 4, 5  # tags
SILENCE_S = 3  # the process group's timeout in the timeout scenario
WITHIN_S = 60  # how long a wait that keeps its own time waits in the lost-peer scenarios


def _outcome(exc: BaseException | None, **seen) -> dict:
    if exc is None:
        return {"raised": None, **seen}
    return {"raised": type(exc).__name__, "rank": getattr(exc, "rank", "-"),
            "message": str(exc), **seen}


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_until_stopped(pid_file: Path) -> int:
    """The pid a rank left in `pid_file`, once that process is stopped (SIGSTOP)."""
    _wait_for(pid_file)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)
    return pid


def _beyond_the_sockets() -> int:
    """Float32 values of a message longer than a loopback connection holds (the sender's
    buffer, which Gloo sizes up to 32 MiB as the kernel allows, and the receiver's, both
    doubled by the kernel), so that part of it waits to be written."""
    def setting(name: str) -> int:
        return max(int(v) for v in Path(f"/proc/sys/net/{name}").read_text().split())
    held = 2 * min(32 << 20, setting("core/wmem_max")) + 2 * max(setting("core/rmem_max"),
                                                                 setting("ipv4/tcp_rmem"))
    return 2 * held // 4


def _send_queued_at_a_death(rank: int, transport: Transport, out: Path) -> dict:
    """Rank 0 sends a long message to rank 1, which has posted its receive and then stopped
    reading (SIGSTOP): part of it waits in Gloo to be written when rank 1 is killed."""
    numel = _beyond_the_sockets()
    if rank == 1:
        kept = transport.irecv(torch.empty(numel), 0, tag=DATA)  # noqa: F841 - posted
        (out / "1.pid").write_text(str(os.getpid()))
        transport.isend(torch.ones(1), 0, tag=GO).wait()  # after the receive, on one stream
        os.kill(os.getpid(), signal.SIGSTOP)
    transport.irecv(torch.empty(1), 1, tag=GO).wait()  # rank 1's receive is known here now
    peer = _wait_until_stopped(out / "1.pid")
    pending = transport.isend(torch.ones(numel), 1, tag=DATA)  # written at once, in part
    os.kill(peer, signal.SIGKILL)
    try:
        pending.wait(WITHIN_S)
    except Exception as exc:  # noqa: BLE001 - what it was is the outcome
        return _outcome(exc)
    return _outcome(None)


def _receive_cut_short(rank: int, transport: Transport, out: Path) -> dict:
    """Rank 1 sends a long message to rank 0, which has posted its receive and then stopped
    (SIGSTOP); rank 1 is killed with part of it on its way, and rank 0 is continued."""
    numel = _beyond_the_sockets()
    if rank == 1:
        transport.irecv(torch.empty(1), 0, tag=GO).wait()  # rank 0's receive is known now
        _wait_until_stopped(out / "0.pid")
        kept = transport.isend(torch.ones(numel), 0, tag=DATA)  # noqa: F841 - in part
        os.kill(os.getpid(), signal.SIGKILL)
    pending = transport.irecv(torch.empty(numel), 1, tag=DATA)
    (out / "0.pid").write_text(str(os.getpid()))
    transport.isend(torch.ones(1), 1, tag=GO).wait()  # after the receive, on one stream
    os.kill(os.getpid(), signal.SIGSTOP)  # continued by the test once rank 1 is dead
    try:
        pending.wait(WITHIN_S)
    except Exception as exc:  # noqa: BLE001
        return _outcome(exc)
    return _outcome(None)


def _lost_then_served_past_the_timeout(rank: int, transport: Transport) -> dict:
    """Rank 0 receives from ranks 1 and 2; rank 2 dies; rank 0 goes on taking rank 1's
    messages (one at a time, when it asks) until twice the timeout has passed."""
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    more = torch.ones(1)
    if rank == 1:
        while more.item():
            transport.isend(torch.ones(1), 0).wait()
            transport.irecv(more, 0, tag=GO).wait()
        return {}
    receiver, raised, lost_at = transport.receiver([1, 2], 1), [], None
    while lost_at is None or time.monotonic() < lost_at + 2 * SILENCE_S:
        try:
            src, _ = receiver.take()
        except PeerLost as exc:
            raised.append(_outcome(exc))
            lost_at = lost_at or time.monotonic()
            continue
        except PeerSilent as exc:
            raised.append(_outcome(exc))
            break
        receiver.release(src)
        time.sleep(0.1)  # asked for at a pace, not at full speed
        transport.isend(more, 1, tag=GO).wait()
    transport.isend(torch.zeros(1), 1, tag=GO).wait()
    return {"raised": raised}


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
    name, _, how = scenario.partition(":")
    transport = Transport()
    # "served": a receiver keeping its own time, as a server's that may go on (server.py)
    transport.open(rank, world, list(range(world - 2, world)),
                   timeout=SILENCE_S if name == "served" else None)
    transport.barrier()
    plays = {"counted": lambda: _counted_on_completion(rank, transport),
             "sampled": lambda: _sampled_through_a_window(rank, transport),
             "killed": lambda: _peer_killed(rank, transport, how),
             "silent": lambda: _silent_peer(rank, transport, out),
             "bug": lambda: _a_bug_in_a_receive(rank, transport),
             "longer": lambda: _longer_than_its_receive(rank, transport),
             "priorities": lambda: _network_priorities(transport),
             "regroup": lambda: _survivors_regroup(rank, transport),
             "queued": lambda: _send_queued_at_a_death(rank, transport, out),
             "cut": lambda: _receive_cut_short(rank, transport, out),
             "served": lambda: _lost_then_served_past_the_timeout(rank, transport)}
    result = plays[name]()
    (out / f"{rank}.json.tmp").write_text(json.dumps(result))
    os.replace(out / f"{rank}.json.tmp", out / f"{rank}.json")
    os._exit(0)  # no teardown of a group whose peer may be dead


def pair(tmp_path: Path, scenario: str, timeout_s: float = 60, world: int = 2,
         stopped: int | None = None) -> tuple[list, list[int]]:
    """Run `scenario` on ranks 0 and 1 (or `world` ranks, the last two its workers); (what
    each wrote, None if nothing; exit codes). `stopped`: a rank that stops itself, continued
    (SIGCONT) once every other rank has ended."""
    ctx = forkserver.context()
    procs = [ctx.Process(target=_rank, args=(r, scenario, str(tmp_path), timeout_s, world))
             for r in range(world)]
    for p in procs:
        p.start()
    for r, p in sorted(enumerate(procs), key=lambda rank: rank[0] == stopped):
        if r == stopped:
            os.kill(p.pid, signal.SIGCONT)
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


def test_a_send_gloo_holds_to_a_peer_killed_is_lost_not_waited_on_for_ever(tmp_path):
    """Gloo fails the works it holds as posted when a peer's connection breaks, but leaves a
    send it is writing (part of it queued behind a full socket) neither done nor failed: a
    server replying to a worker as it died waited on it for the whole timeout (for ever in
    the thread that waits for it), and the run with it. The watch on the peer ends the wait
    (comm/waiting.py)."""
    (got, dead), codes = pair(tmp_path, "queued")
    assert codes == [0, -signal.SIGKILL] and dead is None
    assert got["raised"] == "PeerLost" and got["rank"] == 1, got


def test_a_receive_cut_short_by_its_peers_death_is_lost_not_waited_on_for_ever(tmp_path):
    """Gloo leaves a receive it was reading when its peer's connection broke (the message cut
    short: a push from a worker killed as it sent it) neither done nor failed."""
    (got, dead), codes = pair(tmp_path, "cut", stopped=0)
    assert codes == [0, -signal.SIGKILL] and dead is None
    assert got["raised"] == "PeerLost" and got["rank"] == 1, got


def test_a_source_lost_is_said_once_not_again_as_silent_after_the_timeout(tmp_path):
    """A server going on without a lost worker heard of it once: its receiver then called
    the same worker silent once the timeout had passed since its last receive was posted,
    and the server, for which it was gone already, failed the run."""
    got, codes = pair(tmp_path, "served", world=3)
    assert codes == [0, 0, -signal.SIGKILL]
    (lost,) = got[0]["raised"]
    assert lost["raised"] == "PeerLost" and lost["rank"] == 2, got[0]


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
    # a lost peer: launch/process/failures.py), and its peers then see a closed connection.
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
