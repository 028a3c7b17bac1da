"""The workers' all-reduce where members may change (comm/membership.py), over real Gloo, five
processes: a worker killed between steps or in the middle of one, every survivor leaving the
generation at once (none waits out a timeout), all of them agreeing on who is left, on the
step where the change came, and on every sum, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from polyrhythm.comm import group
from polyrhythm.comm.collectives import TAG_BASE
from polyrhythm.comm.faults import PeerLost
from polyrhythm.comm.transport import WORKERS, WORLD, Transport
from polyrhythm.launch.process import forkserver

WORLD_SIZE, STEPS = 5, 30
# Longer than the harness waits (JOIN_S): a survivor that waited out a timeout for a peer
# that is not its neighbour in the ring is still running when the harness gives up.
TIMEOUT_S, JOIN_S = 30.0, 25


def _rank(rank: int, out: str, victim: int, dies: str, algorithm: str, least: int,
          at: int) -> None:
    out = Path(out)
    group.join(rank, WORLD_SIZE, TIMEOUT_S,
               store=group.file_store(out / "store", WORLD_SIZE, TIMEOUT_S))
    transport = Transport()
    transport.open(rank, WORLD_SIZE, list(range(WORLD_SIZE)), timeout=TIMEOUT_S,
                   elastic=least)
    result = {"sums": [], "raised": None}
    try:
        if algorithm == "exchange":
            result["sums"] = _exchanges(rank, victim, transport)
        else:
            result["sums"] = _sums(rank, victim, transport, dies, algorithm, out, at)
        # The end of a run: the survivors meet in a group of their own (the first done
        # waits there for the others, which may be an exchange or two behind). One that
        # completed the last sum as the victim died learns of it as it answers the others
        # (Membership.finish), on a thread of its own: waited for here, with a bound.
        transport.membership.finish()
        deadline = time.monotonic() + JOIN_S
        while (at == STEPS - 1 and not transport.membership.changes
               and time.monotonic() < deadline):
            time.sleep(0.005)
        transport.exclude(set(transport.membership.changes[0][1])
                          if transport.membership.changes else set())
        transport.barrier()
    except PeerLost as exc:
        result["raised"] = str(exc)
    result["changes"] = [(done, lost) for done, lost, _ in transport.membership.changes]
    result["world"] = transport.members(WORLD)
    (out / f"{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def _sums(rank: int, victim: int, transport: Transport, dies: str, algorithm: str,
          out: Path, at: int) -> list[float]:
    """Each step, an all-reduce of a value: its sum, each step's; the victim dies at step
    `at`."""
    sums, numel = [], 3_000_000 if dies == "mid-step" else 10_000
    for step in range(STEPS):
        if rank == victim and step == at:
            _die(transport, dies, numel, out, at)
        total = torch.full((numel,), float((rank + 1) * (step + 1)))
        transport.all_reduce(total, WORKERS, algorithm)
        if step == at:  # a sum the victim may wait to see done (sent-to-one)
            (out / f"{rank}-summed").touch()
        assert bool((total == total[0]).all())
        sums.append(total[0].item())
    return sums


def _exchanges(rank: int, victim: int, transport: Transport) -> list[float | None]:
    """Each step, a value to each ring neighbour among the members (Membership.exchange):
    the sum of those received, each step's (None: the others went on past it)."""
    sums = []
    for step in range(STEPS):
        if rank == victim and step == 12:
            os.kill(os.getpid(), signal.SIGKILL)
        value = torch.full((1000,), float((rank + 1) * (step + 1)))

        def plan(members: list[int], value=value) -> tuple[dict, dict]:
            me = members.index(rank)
            ranks = sorted({members[(me - 1) % len(members)],
                            members[(me + 1) % len(members)]} - {rank})
            return dict.fromkeys(ranks, value), {r: torch.empty(1000) for r in ranks}

        received = transport.membership.exchange(plan)
        sums.append(None if received is None else sum(box[0].item()
                                                      for box in received.values()))
    return sums


def _die(transport: Transport, how: str, numel: int, out: Path, at: int) -> None:
    """Rank `victim`'s end, at step `at`: killed before its all-reduce (between steps), 10 ms
    into it (mid-step), or as the root of a reduce-broadcast that has summed every member's
    tensor and sent the sum to member 1 only (the others never get it from the root), once
    member 1 has it (its all-reduce completed: no alarm ended it first)."""
    if how == "mid-step":
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
        return
    if how == "sent-to-one":
        total = torch.full((numel,), float(at + 1))  # its own value: rank 0's at step `at`
        for peer in range(1, WORLD_SIZE):
            part = torch.empty(numel)
            transport.irecv(part, peer, TAG_BASE).wait()
            total += part
        transport.isend(total, 1, TAG_BASE + 1).wait()
        deadline = time.monotonic() + JOIN_S
        while not (out / "1-summed").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)


def _run(tmp_path: Path, victim: int, dies: str, algorithm: str = "ring",
         least: int = 1, at: int = 12) -> dict[int, dict]:
    ctx = forkserver.context()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path), victim, dies, algorithm, least,
                                             at))
             for r in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not alive, f"ranks still running after {JOIN_S} s: a survivor waited out a timeout"
    return {r: json.loads((tmp_path / f"{r}.json").read_text())
            for r in range(WORLD_SIZE) if r != victim}


def _expected(step: int, members: list[int]) -> float:
    return float(sum((m + 1) * (step + 1) for m in members))


@pytest.mark.parametrize(("victim", "algorithm"), [(2, "ring"), (0, "ring"), (3, "tree")])
def test_a_worker_killed_between_steps_is_left_out_from_its_next_step_on(tmp_path, victim,
                                                                         algorithm):
    results = _run(tmp_path, victim, "between-steps", algorithm)
    survivors = [r for r in range(WORLD_SIZE) if r != victim]
    for r, result in results.items():
        assert result["raised"] is None, (r, result["raised"])
        assert result["changes"] == [[12, [victim]]]
        assert result["sums"] == [_expected(s, list(range(WORLD_SIZE))) for s in range(12)] + \
            [_expected(s, survivors) for s in range(12, STEPS)]
        assert result["world"] == survivors


def test_a_worker_killed_mid_step_leaves_every_survivor_with_the_same_sums(tmp_path):
    """Killed while its peers are in an all-reduce (3M values a sum): each step's sum is the
    five's or the four's, the change comes at one step, the same on every survivor (a survivor
    that completed the interrupted sum hands it to those that did not), and every sum agrees
    bit for bit."""
    results = _run(tmp_path, 1, "mid-step")
    survivors = [0, 2, 3, 4]
    (first, *others) = results.values()
    assert first["raised"] is None
    (change,) = first["changes"]
    assert change[1] == [1]
    at = next(s for s in range(STEPS)  # the first step summed over the four
              if first["sums"][s] != _expected(s, list(range(WORLD_SIZE))))
    assert first["sums"] == [_expected(s, list(range(WORLD_SIZE))) for s in range(at)] + \
        [_expected(s, survivors) for s in range(at, STEPS)]
    assert all(o["sums"] == first["sums"] and o["raised"] is None for o in others)


def test_a_sum_one_survivor_completed_is_handed_to_the_others(tmp_path):
    """The root of a reduce-broadcast dies having sent step 12's sum (its own share in it) to
    member 1 only: member 1 hands it to the others, so every survivor's step 12 is the five's
    sum, and the four's from step 13 on."""
    results = _run(tmp_path, 0, "sent-to-one", "reduce-broadcast")
    for r, result in results.items():
        assert result["raised"] is None, (r, result["raised"])
        assert result["changes"] == [[12, [0]]]
        assert result["sums"] == [_expected(s, list(range(WORLD_SIZE))) for s in range(13)] + \
            [_expected(s, [1, 2, 3, 4]) for s in range(13, STEPS)]


def test_the_last_sum_one_survivor_completed_is_handed_over_though_it_has_finished(tmp_path):
    """As above, at the last step: member 1 completes it and finishes (nothing left to sum)
    while the others, their sum cut short, greet it. It answers as it comes and hands its
    sum over (Membership.finish): every survivor's last step is the five's sum, and none
    waits out the timeout (longer than the harness waits) to call it lost."""
    results = _run(tmp_path, 0, "sent-to-one", "reduce-broadcast", at=STEPS - 1)
    for r, result in results.items():
        assert result["raised"] is None, (r, result["raised"])
        assert result["changes"] == [[STEPS - 1, [0]]], (r, result["changes"])
        assert result["sums"] == [_expected(s, list(range(WORLD_SIZE))) for s in range(STEPS)]
        assert result["world"] == [1, 2, 3, 4]


def test_an_exchange_with_ring_neighbours_goes_on_over_the_ring_left(tmp_path):
    """Each step each member sends a value to its ring neighbours among the members (D-PSGD's
    exchange); rank 2 killed before step 12. An exchange needs only the neighbours' part, so
    as the loss is found members may be a step or two apart (from step 10 on, whichever the
    timing gives): each step of a survivor is then the ring of five's, or skipped (the others
    went on past it), or the ring of four's; and from the step where any survivor is on the
    ring of four, all are, to the end."""
    results = _run(tmp_path, 2, "between-steps", "exchange")

    def neighbours_sum(rank: int, step: int, members: list[int]) -> float:
        me = members.index(rank)
        ring = {members[(me - 1) % len(members)], members[(me + 1) % len(members)]} - {rank}
        return float(sum((r + 1) * (step + 1) for r in ring))

    five, four = [0, 1, 2, 3, 4], [0, 1, 3, 4]
    for r, result in results.items():
        assert result["raised"] is None and result["changes"][0][1] == [2], result
        assert 10 <= result["changes"][0][0] <= 12, result
        for s, value in enumerate(result["sums"]):
            assert value in (neighbours_sum(r, s, five), None, neighbours_sum(r, s, four)), (
                r, s, value)
        assert result["sums"][:10] == [neighbours_sum(r, s, five) for s in range(10)]
    # Ranks 1 and 3 are the ones whose neighbours the ring of four changes.
    regrouped = min(s for r in (1, 3) for s, value in enumerate(results[r]["sums"])
                    if value == neighbours_sum(r, s, four))
    for r, result in results.items():
        assert result["sums"][regrouped:] == [neighbours_sum(r, s, four)
                                              for s in range(regrouped, STEPS)], (r, result)


def test_fewer_workers_than_the_least_fails_every_survivor_naming_the_lost_one(tmp_path):
    results = _run(tmp_path, 4, "between-steps", least=5)
    for result in results.values():
        assert result["raised"] == ("rank 4 is gone: 4 workers would be left, fewer than "
                                    "min_workers 5")
