"""The one supervisor every launcher watches its processes with (launch/process/supervisor.py):
which rank a failure is named for, going on without a lost worker, processes of several
ranks, and the stop that ends what ignores SIGTERM. Handles here are stand-ins seen as the
supervisor sees any: poll, wait, terminate, kill."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polyrhythm.context import Topology
from polyrhythm.errors import RunFailed
from polyrhythm.launch.process.failures import Kind, RankFailure
from polyrhythm.launch.process.supervisor import Popened, Supervisor, stop
from polyrhythm.metrics.records import RunRecord

HANG_GUARD_S = 60


class _Proc:
    """A process running `ranks` that ends with `code` after being looked at `after` times
    (None: runs until ended here)."""

    pid = None

    def __init__(self, ranks: tuple[int, ...], code: int | None = 0, after: int = 0) -> None:
        self.ranks, self.code, self.after, self.ended_here = ranks, code, after, None

    def poll(self) -> int | None:
        if self.ended_here is not None:
            return self.ended_here
        if self.code is None:
            return None
        if self.after > 0:
            self.after -= 1
            return None
        return self.code

    def wait(self, timeout: float | None = None) -> int | None:
        return self.poll()

    def terminate(self) -> None:
        if self.poll() is None:
            self.ended_here = -signal.SIGTERM

    kill = terminate


class _Watched(Supervisor):
    """A supervisor whose ranks' reports are given, training under way, saying into a list."""

    grace_s = 30.0  # never reached: each case has a rank that explains it
    poll_s = 0.001

    def __init__(self, procs, topology, record, reports=None, carry_on=False,
                 min_workers=1) -> None:
        super().__init__(procs, topology, record, carry_on, min_workers)
        self.given = reports or {}
        self.said: list[tuple[list[int], str]] = []

    def reports(self) -> dict[int, RankFailure]:
        return self.given

    def training(self) -> bool:
        return True

    def say_lost(self, ranks: list[int], line: str) -> None:
        self.said.append((ranks, line))


def _record(tmp_path) -> RunRecord:
    record = RunRecord(tmp_path, "r")
    (record.dir / "logs").mkdir(parents=True)
    return record


def test_a_failure_is_named_for_the_rank_that_explains_it_once_that_rank_is_seen(tmp_path):
    """The server saw the worker's connection break and ended first; the worker, killed,
    is seen ended only later: the run is named for the worker, and the others are
    stopped."""
    server = _Proc((0,), code=1)
    waiting = _Proc((1,), code=None)
    killed = _Proc((2,), code=-signal.SIGKILL, after=5)
    lost = {0: RankFailure(0, Kind.LOST, "PeerLost: rank 2 is gone: ...")}
    with pytest.raises(RunFailed) as failed:
        _Watched([server, waiting, killed], Topology(1, 2), _record(tmp_path), lost).run()
    assert str(failed.value) == "rank 2 (worker 1) was killed by SIGKILL"
    assert waiting.poll() == -signal.SIGTERM


def test_an_error_of_its_own_explains_a_run_before_a_lost_peer(tmp_path):
    reports = {1: RankFailure(1, Kind.LOST, "PeerLost: rank 2 is gone: ..."),
               2: RankFailure(2, Kind.BUG, "ValueError: a bug")}
    record = _record(tmp_path)
    procs = [_Proc((0,), code=None), _Proc((1,), code=1), _Proc((2,), code=1, after=3)]
    with pytest.raises(RunFailed) as failed:
        _Watched(procs, Topology(1, 2), record, reports).run()
    assert str(failed.value) == (f"rank 2 (worker 1) raised ValueError: a bug; traceback in "
                                 f"{record.log_path(2)}")


def test_a_run_that_may_carry_on_goes_on_without_a_lost_worker(tmp_path):
    """on_worker_failure = continue: a worker killed during training is said lost, and the
    run ends well when the others do; a second loss of the last worker is no going on."""
    procs = [_Proc((0,)), _Proc((1,), code=-signal.SIGKILL), _Proc((2,), after=20)]
    watched = _Watched(procs, Topology(1, 2), _record(tmp_path), carry_on=True)
    watched.run()
    assert watched.lost == {1}
    assert watched.said == [([1], "lost: was killed by SIGKILL; the others go on")]
    procs = [_Proc((0,), code=None), _Proc((1,), code=-signal.SIGKILL),
             _Proc((2,), code=-signal.SIGKILL, after=1)]
    with pytest.raises(RunFailed) as failed:
        _Watched(procs, Topology(1, 2), _record(tmp_path / "b"), carry_on=True).run()
    assert str(failed.value) == "rank 2 (worker 1) was killed by SIGKILL"


def test_a_loss_that_leaves_fewer_than_min_workers_ends_the_run_saying_so(tmp_path):
    """3 workers, min_workers 2: the first loss leaves 2, and the run goes on; the second
    would leave 1, and ends the run, naming the worker and min_workers."""
    procs = [_Proc((0,), code=None), _Proc((1,), code=-signal.SIGKILL),
             _Proc((2,), code=-signal.SIGKILL, after=1), _Proc((3,), code=None)]
    watched = _Watched(procs, Topology(1, 3), _record(tmp_path), carry_on=True, min_workers=2)
    with pytest.raises(RunFailed) as failed:
        watched.run()
    assert watched.lost == {1}
    assert str(failed.value) == ("rank 2 (worker 1) was killed by SIGKILL; 1 worker would be "
                                 "left, fewer than --min-workers 2")


def test_min_workers_is_said_whichever_ends_first_the_lost_worker_or_its_server(tmp_path):
    """The server that lost the worker (and stopped for min_workers), and a worker that then
    lost its server, may be seen ended before the worker killed: the line still names the
    worker killed, and min_workers."""
    reports = {0: RankFailure(0, Kind.LOST, "PeerLost: rank 3 is gone"),
               1: RankFailure(1, Kind.LOST, "PeerLost: rank 0 is gone")}  # then its server
    procs = [_Proc((0,), code=1), _Proc((1,), code=1), _Proc((2,), code=None),
             _Proc((3,), code=-signal.SIGKILL)]
    watched = _Watched(procs, Topology(1, 3), _record(tmp_path), reports, carry_on=True,
                       min_workers=3)
    with pytest.raises(RunFailed) as failed:
        watched.run()
    assert str(failed.value) == ("rank 3 (worker 2) was killed by SIGKILL; 2 workers would be "
                                 "left, fewer than --min-workers 3")


def test_a_process_of_several_ranks_gives_each_its_code(tmp_path):
    """A host's torchrun ends all its ranks when one dies: the rank that reported a failure
    failed, the others were killed; a host that ended well ended each rank well."""
    reports = {3: RankFailure(3, Kind.BUG, "ValueError: x")}
    watched = _Watched([_Proc((0, 1)), _Proc((2, 3), code=1)], Topology(1, 3),
                       _record(tmp_path), reports)
    assert [watched.code_of(r) for r in range(4)] == [0, 0, -signal.SIGKILL, 1]


def test_stop_kills_what_ignores_sigterm_and_ends_what_does_not(tmp_path):
    ignoring = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    obeying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert ignoring.stdout.readline() == "ready\n"  # its handler is set
        stop([Popened(ignoring, (0,)), Popened(obeying, (1,))], grace_s=0.5)
        assert ignoring.poll() == -signal.SIGKILL and obeying.poll() == -signal.SIGTERM
    finally:
        for p in (ignoring, obeying):
            p.kill()
            p.wait(HANG_GUARD_S)


def test_a_stopped_process_explains_its_silent_peers_and_is_killed_without_the_grace(tmp_path):
    """A rank stopped (SIGSTOP) leaves its peers waiting until their timeout: it is named,
    with no grace waited for another cause, and stop kills it at once (it cannot act on
    SIGTERM): graces of 10 minutes are never waited out."""
    stopped = [_stopped_process(), _stopped_process()]
    try:
        silent = {1: RankFailure(1, Kind.SILENT, "PeerSilent: rank 0 sent nothing ...")}
        watched = _Watched([Popened(stopped[0], (0,)), _Proc((1,), code=1)], Topology(1, 1),
                           _record(tmp_path), silent)
        watched.grace_s = 600.0
        failed: list[str] = []

        def watch() -> None:
            with pytest.raises(RunFailed) as raised:
                watched.run()
            failed.append(str(raised.value))
        _within_the_guard(watch)
        assert failed == ["rank 0 (server 0) stopped answering: no message from it within the "
                          "timeout (--timeout)"]
        _within_the_guard(lambda: stop([Popened(stopped[1], (0,))], grace_s=600.0))
        assert [p.wait(HANG_GUARD_S) for p in stopped] == [-signal.SIGKILL] * 2
    finally:
        for p in stopped:
            p.kill()
            p.wait(HANG_GUARD_S)


def _stopped_process() -> subprocess.Popen:
    """A process that has stopped itself (SIGSTOP), once it has."""
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal\n"
                             "os.kill(os.getpid(), signal.SIGSTOP)"])
    deadline = time.monotonic() + HANG_GUARD_S
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the process never stopped"
        time.sleep(0.01)
    return proc


def _within_the_guard(call) -> None:
    """Run `call` in a thread; fail if it has not returned within the hang guard."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "a grace was waited out"
