"""A bug is reported as a bug: a rank's error of its own (or a crash) ends the run even where a
lost worker would not, in one line that names it and points at the log holding its
traceback; only a killed worker, or one cut off from its peers, is a lost one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import polyrhythm
from helpers import small_config
from polyrhythm.comm.faults import PeerLost, PeerSilent
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError, Diverged, RunFailed
from polyrhythm.launch.launchers import emulated, local
from polyrhythm.launch.launchers.progress import ProgressBoard
from polyrhythm.launch.process.failures import (
    Kind,
    RankFailure,
    cause,
    how,
    is_a_loss,
    read_reports,
    write_report,
)
from polyrhythm.launch.process.supervisor import Forked
from polyrhythm.launch.rank import torchrun
from polyrhythm.metrics.records import RunRecord
from polyrhythm.metrics.store import RunStore

# A user's models, each wrong on rank 2 (worker 1) only, once training is under way.
USER_MODELS = """
import math

import torch.distributed as dist
from torch import nn


class Raising(nn.Module):
    def __init__(self, shape, classes):
        super().__init__()
        self.layer = nn.Linear(math.prod(shape), classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if dist.is_initialized() and dist.get_rank() == 2 and self.calls == 5:
            raise ValueError("a bug in the model")
        return self.layer(x.flatten(1))


def raising(shape, classes):
    return Raising(shape, classes)


def short_receives(shape, classes):
    # From its 20th receive on, rank 2 posts each with a buffer one element shorter than the
    # message it will get.
    # (Every receive is posted through comm/transport.py's post_receive.)
    if dist.is_initialized() and dist.get_rank() == 2:
        from polyrhythm.comm import transport

        real, calls = transport.post_receive, [0]

        def post_receive(tensor, *args, **kwargs):
            calls[0] += 1
            return real(tensor[:-1] if calls[0] >= 20 else tensor, *args, **kwargs)

        transport.post_receive = post_receive
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), classes))
"""


def failed_run(tmp_path, model: str, said: str) -> str:
    """Run `polyrhythm train` of bsp told to continue with 3 workers and one of USER_MODELS;
    check that it failed with the one line `said` (LOG in it: rank 2's log), shown and
    stored, and return rank 2's log. A run that a lost worker does not end: what ends it is
    the error, not a loss. bsp, not asp: its workers step together, so the fault comes with
    most of the run still to go; under asp the others had taken all their steps, and the
    run was recorded complete, before the launcher saw rank 2's report (rank 2 started late
    under load: a fresh clone's suite, 1 in 7 runs beside two busy loops)."""
    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    run = subprocess.run(
        [sys.executable, "-m", "polyrhythm.cli", "train", "--strategy", "bsp", "--workers", "3",
         "--on-worker-failure", "continue",
         "--dataset", "digits", "--epochs", "4", "--model", f"usermodels:{model}",
         "--out", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    (row,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    log = tmp_path / "runs" / row["run_id"] / "logs" / "rank2.log"
    said = said.replace("LOG", str(log))
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert said in run.stderr and "Traceback" not in run.stderr and "is gone" not in run.stderr
    assert row["status"] == "failed" and said in row["error"]
    return log.read_text()


def test_a_workers_bug_ends_the_run_naming_its_error_and_the_log_with_its_traceback(tmp_path):
    log = failed_run(tmp_path, "raising",
                     "rank 2 (worker 1) raised ValueError: a bug in the model; traceback in LOG")
    assert "Traceback (most recent call last)" in log
    assert "in forward" in log and "ValueError: a bug in the model" in log


def test_a_receive_of_the_wrong_size_crashes_its_rank_which_is_no_lost_worker(tmp_path):
    # Gloo aborts a process whose receive is shorter than the message (tests/test_transport.py).
    log = failed_run(tmp_path, "short_receives",
                     "rank 2 (worker 1) crashed (SIGABRT); its output is in LOG")
    assert "Received data size doesn't match expected size" in log


def test_a_bug_in_the_launcher_leaves_its_traceback_in_the_runs_logs(tmp_path, monkeypatch):
    def supervise(*args, **kwargs):
        raise ValueError("a bug in the launcher")

    monkeypatch.setattr(local.LocalSupervisor, "run", supervise)
    config = small_config(tmp_path, workers=1, epochs=1, dataset="digits")
    with pytest.raises(RunFailed) as failed:
        polyrhythm.train(config)
    (row,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    log = tmp_path / "runs" / row["run_id"] / "logs" / "launcher.log"
    said = f"failed: the launcher raised ValueError: a bug in the launcher; traceback in {log}"
    assert str(failed.value) == f"run {row['run_id']} {said}"
    assert row["status"] == "failed" and row["error"] == said
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in supervise" in text


# --- telling failures apart, without processes ---------------------------------------------

def test_a_failures_kind_comes_from_its_type():
    cases = [(Diverged("diverged at epoch 1, step 3: training loss nan"), Kind.DIVERGED,
              "diverged at epoch 1, step 3: training loss nan"),
             (PeerLost(0, RuntimeError("Connection closed by peer")), Kind.LOST,
              "PeerLost: rank 0 is gone: Connection closed by peer"),
             (PeerSilent(0, RuntimeError("Timed out")), Kind.SILENT,
              "PeerSilent: rank 0 sent nothing within the timeout: Timed out"),
             (ConfigError("bad\nsecond line"), Kind.USER, "ConfigError: bad"),
             # A bug whose words read like a lost peer is still a bug.
             (RuntimeError("rank 0 is gone: Connection closed by peer"), Kind.BUG,
              "RuntimeError: rank 0 is gone: Connection closed by peer")]
    for exc, kind, error in cases:
        failure = RankFailure.of(3, exc)
        assert failure == RankFailure(3, kind, error)
        assert RankFailure.from_dict(failure.as_dict()) == failure


def test_only_a_killed_worker_or_one_cut_off_from_its_peers_is_lost():
    def report(kind):
        return RankFailure(2, kind, "...")

    assert is_a_loss(-signal.SIGKILL, None) and is_a_loss(-signal.SIGTERM, None)
    assert not any(is_a_loss(-sig, None) for sig in (signal.SIGABRT, signal.SIGSEGV))
    assert is_a_loss(1, report(Kind.LOST)) and is_a_loss(1, report(Kind.SILENT))
    assert not any(is_a_loss(1, report(k)) for k in (Kind.BUG, Kind.USER, Kind.DIVERGED))
    assert not is_a_loss(1, None)
    # It lost a peer, then aborted on its way out: the peer explains it.
    assert is_a_loss(-signal.SIGABRT, report(Kind.LOST))


def test_the_cause_is_the_rank_that_explains_the_others():
    lost, bug, silent = Kind.LOST, Kind.BUG, Kind.SILENT

    def of(kinds: dict) -> dict:
        return {r: RankFailure(r, k, "...") for r, k in kinds.items()}

    # A bug explains the broken connections it leaves behind, a killed rank everything but a
    # divergence; a timeout comes before a lost peer; the lowest rank among equals.
    assert cause([1, 2, 3], {1: 1, 2: 1, 3: 1}, of({1: lost, 2: bug, 3: lost})) == 2
    assert cause([1, 2, 3], {1: 1, 2: 1, 3: -9}, of({1: lost, 2: bug})) == 3
    assert cause([0, 1], {0: 1, 1: -9}, of({0: Kind.DIVERGED})) == 0
    assert cause([1, 2], {1: 1, 2: 1}, of({1: lost, 2: silent})) == 2
    assert cause([2, 1], {1: 1, 2: 1}, of({1: bug, 2: Kind.USER})) == 1
    assert cause([1, 2], {}, of({1: lost, 2: bug})) == 2  # exit codes unknown (torchrun)
    # Rank 0 reported its lost peer, then aborted at exit: the killed rank 2 still explains it.
    assert cause([0, 2], {0: -signal.SIGABRT, 2: -signal.SIGKILL}, of({0: lost})) == 2


def test_how_a_rank_ended_in_words():
    assert how(-signal.SIGKILL, None, "L") == "was killed by SIGKILL"
    assert how(-signal.SIGABRT, None, "L") == "crashed (SIGABRT); its output is in L"
    assert how(1, RankFailure(2, Kind.BUG, "ValueError: x"), "L") == (
        "raised ValueError: x; traceback in L")
    assert how(1, RankFailure(2, Kind.LOST, "PeerLost: rank 0 is gone: ..."), "L") == (
        "failed: PeerLost: rank 0 is gone: ...")
    assert how(1, None, "L") == "failed: exit code 1"


class _Host:
    """A host's torchrun as the emulated launcher polls it: ended with `code`."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int:
        return self.code


class _Links:
    """An emulated cluster as the launcher asks it which links are down."""

    def __init__(self, down: list[int]) -> None:
        self.down = down

    def links_down(self) -> list[int]:
        return self.down


def test_the_emulated_launcher_names_a_bug_from_the_reports_the_ranks_left(tmp_path):
    record = RunRecord(tmp_path, "r")
    (record.dir / "logs").mkdir(parents=True)
    layout, topology = [[0, 1], [2, 3]], Topology(1, 3)
    hosts, up = [_Host(1), _Host(1)], _Links([])

    def failure(hosts=hosts, cluster=up):
        return emulated._failure(0, layout, topology, record, hosts, cluster)

    write_report(record.dir, RankFailure(1, Kind.LOST, "PeerLost: rank 3 is gone: ..."))
    # Only a lost peer so far: the host whose torchrun failed.
    assert str(failure()) == (f"host 0 (ranks 0, 1) failed: PeerLost: rank 3 is gone: ... "
                              f"(log: {record.dir / 'logs' / 'host0.log'})")
    # A host killed explains its peers' lost connections; a host cut off, their silence.
    assert str(failure(hosts=[_Host(1), _Host(-9)])) == (
        f"host 1 (ranks 2, 3) was killed by SIGKILL (log: {record.dir / 'logs' / 'host1.log'})")
    assert str(failure(cluster=_Links([1]))).startswith(
        "host 1 (ranks 2, 3) was cut off: its link is down")
    write_report(record.dir, RankFailure(3, Kind.BUG, "ValueError: x"))
    assert set(read_reports(record.dir)) == {1, 3}
    assert str(failure(cluster=_Links([1]))) == (f"rank 3 (worker 2) raised ValueError: x; "
                                                 f"traceback in "
                                                 f"{record.dir / 'logs' / 'host1.log'}")
    write_report(record.dir, RankFailure(2, Kind.DIVERGED, "diverged at epoch 2, step 1"))
    failed = failure()
    assert failed.diverged and str(failed) == "diverged at epoch 2, step 1 (worker 1)"


class _Rank:
    """A local rank as the launcher sees it: ended (`code`) from the start, alive for ever
    (None), or killed but seen ended only once the launcher has looked at it once (the
    forkserver reaps it late)."""

    def __init__(self, code: int | None, reaped_late: bool = False) -> None:
        self.sentinel, self._end = os.pipe()
        self.exitcode, self._code, self._late = None, code, reaped_late
        if code is not None and not reaped_late:
            self._reaped()

    def _reaped(self) -> None:
        os.write(self._end, b"x")
        self.exitcode = self._code

    pid = None

    def is_alive(self) -> bool:
        if self._late and self.exitcode is None:
            self._reaped()  # seen next time
            return True
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        self._code, self._late = -signal.SIGTERM, False
        self._reaped()

    kill = terminate


class _Events:
    def __init__(self, *failures: RankFailure) -> None:
        self.failures = list(failures)

    def take(self) -> list[dict]:
        taken, self.failures = [{"failure": f.as_dict()} for f in self.failures], []
        return taken


def test_the_local_launcher_names_a_killed_worker_reaped_after_the_server_it_failed(tmp_path):
    """The server saw the killed worker's connection break and failed first; the worker,
    killed, was reaped by the forkserver only after it (on a loaded machine). The run is
    named for the worker, not for the server that lost it."""
    procs = [_Rank(1), _Rank(None), _Rank(None), _Rank(-signal.SIGKILL, reaped_late=True)]
    events = _Events(RankFailure(0, Kind.LOST, "PeerLost: rank 3 is gone: ..."))
    with pytest.raises(RunFailed) as failed:
        local.LocalSupervisor([Forked(p, (r,)) for r, p in enumerate(procs)], events,
                              ProgressBoard(3, enabled=False), Topology(1, 3),
                              RunRecord(tmp_path, "r")).run()
    assert str(failed.value) == "rank 3 (worker 2) was killed by SIGKILL"


@pytest.mark.parametrize(("raised", "traceback"), [
    (ValueError("a bug"), True),
    (PeerLost(0, RuntimeError("Connection closed by peer")), False),
])
def test_a_torchrun_rank_prints_a_bugs_traceback_and_one_line(monkeypatch, capsys, raised,
                                                                traceback):
    def run_node(*args):
        raise raised

    monkeypatch.setattr(torchrun, "run_node", run_node)
    assert torchrun.main(["run.toml"]) == 1
    err = capsys.readouterr().err
    assert ("Traceback (most recent call last)" in err) == traceback
    last = f"polyrhythm: error: {type(raised).__name__}: {raised}"
    assert err.splitlines()[-1] == (f"{last} (a bug: traceback above)" if traceback else last)
