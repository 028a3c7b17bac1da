"""One supervisor over the processes that run a job's ranks, for every launcher.

A launcher starts its ranks its own way (forked from the forkserver, each host's torchrun in
its namespace, Spark's barrier tasks, Spark's driver) and hands the supervisor a handle for
each process: what it runs (`ranks`), `poll`, `terminate`, `kill`, `wait`. The supervisor
watches them until every one has ended well, or one fails: then it gives the rank that
explains the failure GRACE_S to show it (a killed rank's peers can see its connections break
before it is seen ended) and raises the one line of what ended the run. Where the run goes
on without a worker lost during training (on_worker_failure = continue: failures.py's
goes_on_without), it says so and watches on; once the run is recorded, it ends the workers
left behind. `stop` ends what still runs: SIGTERM, GRACE_S, SIGKILL, one way for all.

What differs between launchers is a hook each: where the ranks' reports are (`reports`),
what to show as the run goes (`look`, `say_lost`), whether training has begun (`training`),
what a rank's good end may still mean (`ended`), and how a failure is said (`explain`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Protocol

from polyrhythm.errors import RunFailed
from polyrhythm.launch.process.failures import (
    Kind,
    RankFailure,
    cause,
    goes_on_without,
    going_on_without,
    how,
    is_a_loss,
    left_behind,
    lost_a_peer,
    rank_failed,
    read_reports,
    training_began,
    workers_left,
)
from polyrhythm.launch.process.signals import GRACE_S
from polyrhythm.metrics.records import RunRecord

POLL_S = 0.1  # between looks at processes that cannot be waited on together


class RankProcess(Protocol):
    """A process that runs some of the job's ranks (`ranks`; one for a forked rank, a host's
    for its torchrun, every rank for Spark's driver)."""

    ranks: tuple[int, ...]
    pid: int | None

    def poll(self) -> int | None:
        """Its exit code (negative: the signal that ended it), None while it runs."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` seconds (None: for ever) for it to end; its exit code, None
        while it still runs."""

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Forked:
    """A multiprocessing process (forked from the forkserver) as a RankProcess."""

    def __init__(self, process, ranks: tuple[int, ...]) -> None:
        self.process, self.ranks = process, ranks

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.poll()

    def terminate(self) -> None:
        if self.process.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()


class Popened:
    """A subprocess.Popen as a RankProcess; `group`: it leads a process group of its own,
    which is ended with it."""

    def __init__(self, popen: subprocess.Popen, ranks: tuple[int, ...],
                 group: bool = False) -> None:
        self.popen, self.ranks, self.group = popen, ranks, group
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        return self.popen.poll()

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.group:  # also what the process started, after it has ended
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, number)
        elif self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(number)


def stop(procs: Sequence[RankProcess], grace_s: float = GRACE_S) -> None:
    """SIGTERM every process still running, SIGKILL those left after `grace_s` (one deadline
    for all); a stopped process (SIGSTOP, a debugger) at once: it cannot act on SIGTERM
    until continued."""
    for p in procs:
        if p.poll() is None:
            if _stopped(p.pid):
                p.kill()
            else:
                p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.wait(max(0.0, deadline - time.monotonic()))
        if p.poll() is None:
            p.kill()
            p.wait(grace_s)


class Supervisor:
    """Watches `procs`, the processes of one run (`record`) of `topology`'s ranks (module
    docstring); `carry_on`: the run goes on without a worker lost during training, while
    `min_workers` are left. A launcher subclasses it for its hooks."""

    grace_s = GRACE_S
    poll_s = POLL_S

    def __init__(self, procs: Sequence[RankProcess], topology, record: RunRecord,
                 carry_on: bool = False, min_workers: int = 1) -> None:
        self.procs, self.topology, self.record, self.carry_on = procs, topology, record, carry_on
        self.min_workers = min_workers
        self.lost: set[int] = set()  # the ranks the run went on without
        self._seen: set[int] = set()  # the procs seen ended

    # --- the hooks ---------------------------------------------------------------------

    def reports(self) -> dict[int, RankFailure]:
        """The failures the ranks reported so far, by rank (in the run's logs by default)."""
        return read_reports(self.record.dir)

    def look(self) -> None:
        """Each turn, and once more at the end: take what the ranks told (progress)."""

    def training(self) -> bool:
        """Whether training has begun: every rank is past the start, where each waits for
        all (a worker's mark by default)."""
        return training_began(self.record.dir)

    def ended(self, proc: RankProcess, code: int) -> None:
        """`proc` has ended with `code` (not yet judged): raise to end the run otherwise."""

    def say_lost(self, ranks: list[int], line: str) -> None:
        """Say that the run goes on without `ranks`, as `line` (failures.py's
        going_on_without) says."""

    def log_of(self, rank: int) -> Path:
        """Where rank `rank`'s output is."""
        return self.record.log_path(rank)

    def done(self) -> bool:
        """Whether the run is over though some processes still run (they are then stopped)."""
        return False

    def explain(self, proc: RankProcess) -> RunFailed:
        """What ended the run, which `proc` failing began: the rank that explains the others'
        failures (failures.py's cause), among those that ended by themselves or reported an
        error, the workers the run went on without left out."""
        reports = {r: f for r, f in self.reports().items() if r not in self.lost}
        codes = {r: code for p in self.procs for r in p.ranks
                 if r not in self.lost and (code := self.code_of(r)) not in (None, 0)}
        first = cause(sorted(set(codes) | set(reports)), codes, reports)
        failure, code = reports.get(first), codes.get(first)
        if failure is not None and failure.kind == Kind.SILENT and (code is None or code >= 0):
            return self._silent_peers(how(code, failure, self.log_of(first)))
        return rank_failed(first, code, failure, self.log_of(first), self.topology)

    def _too_few(self, proc: RankProcess) -> RunFailed | None:
        """Where the run would have gone on without the workers it lost but for min_workers:
        what ended it (which `proc` failing began), saying so; None otherwise. The ranks that
        stopped for them (a server refusing to go on, the workers that lost it) are no cause
        of their own, whichever ended first."""
        if not (self.carry_on and self.training()):
            return None
        ended = [r for p in self.procs for r in p.ranks
                 if r not in self.lost and self.code_of(r) not in (None, 0)]
        self.look()  # what those told before they exited, after their ends were seen
        reports = self.reports()
        # The workers lost by themselves (killed); every other rank ended only for a peer.
        gone = [r for r in ended if self.topology.role(r) == "worker"
                and not lost_a_peer(reports.get(r)) and is_a_loss(self.code_of(r), None)]
        if not gone or any(not lost_a_peer(reports.get(r)) for r in ended if r not in gone):
            return None
        left = workers_left(self.topology, self.lost, gone)
        if not 0 < left < self.min_workers:  # none left: no run goes on, whatever it says
            return None
        failed = self.explain(proc)
        return RunFailed(f"{failed}; {left} worker{'s' * (left != 1)} would be left, fewer "
                         f"than --min-workers {self.min_workers}", failed.run_id)

    def _silent_peers(self, said: str) -> RunFailed:
        """A wait timed out: name the ranks that stopped (SIGSTOP, a debugger) or hang."""
        stopped = [r for p in self.procs if p.poll() is None and _stopped(p.pid)
                   for r in p.ranks]
        if not stopped:
            return RunFailed(f"a peer stopped answering within the timeout (--timeout): {said}")
        names = ", ".join(f"rank {r} ({self.topology.describe(r)})" for r in stopped)
        return RunFailed(f"{names} stopped answering: no message from it within the timeout "
                         "(--timeout)")

    # --- the watch -----------------------------------------------------------------------

    def run(self) -> None:
        """Watch until every process has ended well (or the run is `done`); raise RunFailed
        naming what ended the run otherwise (its processes are then stopped)."""
        while True:
            self.look()
            if self.carry_on:
                self._end_left_behind()
            for i, proc in enumerate(self.procs):
                if i in self._seen or (code := proc.poll()) is None:
                    continue
                self._seen.add(i)
                if set(proc.ranks) <= self.lost:
                    continue
                self.ended(proc, code)
                if code != 0:
                    # What it told before it exited, which this turn's look may have missed:
                    # whether it is lost, or what explains the run's end, depends on it.
                    self.look()
                if code != 0 and not self._goes_on_without(proc, code):
                    self._await_cause()
                    failed = self._too_few(proc) or self.explain(proc)
                    stop(self.procs)
                    raise failed
            if len(self._seen) == len(self.procs) or self.done():
                self.look()
                return
            self._wait(self.poll_s)

    def code_of(self, rank: int) -> int | None:
        """Rank `rank`'s exit code, None while it runs. A process of several ranks that
        failed (torchrun ends them all when one dies) gives each that reported a failure 1,
        the others killed."""
        proc = next(p for p in self.procs if rank in p.ranks)
        code = proc.poll()
        if code in (None, 0) or len(proc.ranks) == 1:
            return code
        return 1 if rank in self.reports() else -signal.SIGKILL

    def _goes_on_without(self, proc: RankProcess, code: int) -> bool:
        ranks = list(proc.ranks)
        if not (self.carry_on and self.training()):
            return False
        reports = self.reports()
        if not goes_on_without(ranks, self.code_of, reports, self.topology, self.lost,
                               self.min_workers):
            return False
        self.lost.update(ranks)
        failure = reports.get(ranks[0]) if len(ranks) == 1 else None
        self.say_lost(ranks, going_on_without(code, failure, self.log_of(ranks[0])))
        return True

    def _end_left_behind(self) -> None:
        """End the workers the completed run went on without that still run (frozen, or cut
        off), as lost: nobody waits for them any more."""
        if not any(0 in p.ranks and p.poll() == 0 for p in self.procs):
            return  # rank 0 records the run as its process ends
        behind = left_behind(self.record) - self.lost
        for proc in self.procs:
            if behind and set(proc.ranks) <= behind and proc.poll() is None:
                self.lost.update(proc.ranks)
                proc.kill()

    def _await_cause(self) -> None:
        """Give the ranks `grace_s` for the one that explains a failure to show it, while
        every rank that failed so far only lost a peer."""
        deadline = time.monotonic() + self.grace_s
        while not self._explained() and time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs):
                return
            self._wait(self.poll_s)
            self.look()

    def _explained(self) -> bool:
        """Whether a rank explains the failure by itself: one that reported an error of its
        own, or ended by itself (a process of one rank that failed, any killed) without
        having lost a peer first, or one stopped (its peers fall silent on it)."""
        reports = self.reports()
        for proc in self.procs:
            code = proc.poll()
            if code is None and _stopped(proc.pid):
                return True
            for r in proc.ranks:
                if r in self.lost:
                    continue
                failure = reports.get(r)
                if failure is not None and not lost_a_peer(failure):
                    return True
                if (code not in (None, 0) and failure is None
                        and (len(proc.ranks) == 1 or code < 0)):
                    return True
        return False

    def _wait(self, timeout: float) -> None:
        """Until a process ends or `timeout` passes: on their sentinels where each has one."""
        running = [p for p in self.procs if p.poll() is None]
        sentinels = [getattr(p, "sentinel", None) for p in running]
        if running and None not in sentinels:
            wait_for(sentinels, timeout)
        else:
            time.sleep(timeout)


def _stopped(pid: int | None) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
