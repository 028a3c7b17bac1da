"""What ended a rank, told by its type, and what a launcher makes of the ranks that failed.

A rank that fails reports a `RankFailure`: its kind, from the exception's type (never from
its words), and the error's one line; a bug's traceback goes to the rank's log. The local
launcher gets the report as an event; the emulated cluster's ranks, which torchrun starts,
write it beside the run's logs. From the failed ranks' reports and exit codes a launcher
picks the rank that explains the others (a dead process explains its peers' broken
connections) and says it in one line, which points at the log holding a bug's traceback.
With on_worker_failure = continue, a launcher first asks `goes_on_without` whether the run
goes on without the ranks that failed: every launcher that may carry on asks the same rules.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TextIO

from polyrhythm.comm.faults import PeerLost, PeerSilent
from polyrhythm.errors import Diverged, PolyrhythmError, RunFailed, StoreError, one_line
from polyrhythm.metrics.records import RunRecord, fail_run, recorded_summary
from polyrhythm.metrics.runfolder import full_disk
from polyrhythm.runtime.checkpoint import complete_epochs

LAUNCHER_LOG = "launcher.log"  # in the run's logs/: the traceback of a bug in the launcher
TRAINING_MARK = "training"  # in the run's logs/: a worker has taken a step (a script's run)
SERVER_DEATH_GRACE_S = 0.2


class Kind(StrEnum):
    DIVERGED = "diverged"  # a non-finite loss or parameter (Diverged): the run is diverged
    LOST = "lost"  # a peer's connection broke (PeerLost): that peer explains it
    SILENT = "silent"  # a peer sent nothing within the timeout (PeerSilent)
    USER = "user"  # another PolyrhythmError: its one line says what to change
    BUG = "bug"  # anything else: a bug, with its traceback in the rank's log


# Signals a process gets when it breaks (abort(), a bad address, ...): a crash, whose output
# says why; other signals (SIGKILL, SIGTERM) are someone ending it.
CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                     signal.SIGILL})


def kind_of(exc: BaseException) -> Kind:
    if isinstance(exc, Diverged):
        return Kind.DIVERGED
    if isinstance(exc, PeerLost):
        return Kind.LOST
    if isinstance(exc, PeerSilent):
        return Kind.SILENT
    return Kind.USER if isinstance(exc, PolyrhythmError) else Kind.BUG


@dataclass(frozen=True)
class RankFailure:
    """What ended rank `rank`: its kind and its error's line ("ValueError: ...", a
    divergence's message alone)."""

    rank: int
    kind: Kind
    error: str

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> RankFailure:
        kind = kind_of(exc)
        line = one_line(exc)
        return cls(rank, kind, line if kind == Kind.DIVERGED else f"{type(exc).__name__}: {line}")

    def as_dict(self) -> dict:
        return {"rank": self.rank, "kind": str(self.kind), "error": self.error}

    @classmethod
    def from_dict(cls, values: dict) -> RankFailure:
        return cls(int(values["rank"]), Kind(values["kind"]), str(values["error"]))

    def log(self, exc: BaseException, file: TextIO) -> None:
        """Write it to the rank's log: a bug's traceback, any other failure's line."""
        if self.kind == Kind.BUG:
            traceback.print_exception(exc, file=file)
        else:
            print(f"polyrhythm: rank {self.rank}: {self.error}", file=file)
        file.flush()


def report_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.failure.json"


def write_report(run_dir: Path, failure: RankFailure) -> None:
    """Leave the report where the launcher reads it (the run's logs); a rank that cannot
    write it still fails, its launcher then saying less."""
    with contextlib.suppress(OSError):
        report_path(run_dir, failure.rank).write_text(json.dumps(failure.as_dict()))


def rank_ended(rank: int, failure: RankFailure | None, reason: str, topology,
               run_dir: Path | None, record: RunRecord | None) -> None:
    """What rank `rank`, ending with an error, leaves: its report for a launcher that watches
    the run (`failure` None: it was stopped, nothing to report), and where it holds the
    record (rank 0), the run recorded as failed with `reason`."""
    if failure is not None and run_dir is not None:
        write_report(run_dir, failure)
    if record is not None:
        fail_run(record, f"rank {rank} ({topology.describe(rank)}): {reason}")


def read_reports(run_dir: Path) -> dict[int, RankFailure]:
    """The reports the ranks of a run left, by rank."""
    found = {}
    for path in (Path(run_dir) / "logs").glob("rank*.failure.json"):
        try:
            failure = RankFailure.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError):
            continue  # being written as the run is stopped
        found[failure.rank] = failure
    return found


def clear_reports(run_dir: Path) -> None:
    """Remove the reports and the marks an earlier launch of the run left (a resumed run's
    ranks write their own)."""
    for pattern in ("rank*.failure.json", "rank*.left"):
        for path in (Path(run_dir) / "logs").glob(pattern):
            path.unlink(missing_ok=True)
    (Path(run_dir) / "logs" / TRAINING_MARK).unlink(missing_ok=True)


def is_a_loss(code: int, failure: RankFailure | None) -> bool:
    """Whether a worker that ended so (exit code, report) is lost, one a run may go on
    without: killed from outside, or failed as a peer's connection broke or it fell silent;
    never one that crashed, raised an error of its own or diverged. One that lost a peer and
    then died (Gloo's threads can abort its exit) is lost: the peer explains it."""
    if lost_a_peer(failure):
        return True
    return code < 0 and -code not in CRASHES


def died_by_itself(code: int | None, failure: RankFailure | None) -> bool:
    """Whether a rank's death explains itself: killed or crashed (a negative exit code), but
    not after it had reported a lost peer (Gloo's threads can abort such a rank's exit): that
    peer explains it."""
    return code is not None and code < 0 and not lost_a_peer(failure)


def lost_a_peer(failure: RankFailure | None) -> bool:
    """Whether a rank failed only because a peer's connection broke or fell silent: that
    peer explains it."""
    return failure is not None and failure.kind in (Kind.LOST, Kind.SILENT)


def goes_on_without(failed: list[int], exit_code: Callable[[int], int | None],
                    failures: dict[int, RankFailure], topology, lost: set[int],
                    min_workers: int = 1) -> bool:
    """Whether a run that may carry on (on_worker_failure = continue, training under way)
    goes on without the `failed` ranks: workers only, each lost (killed, or cut off from its
    peers; not crashed, failed on an error of its own or diverged), never rank 0 (it records
    the run: worker 0 where there are no servers), every server alive (a worker also fails
    when its server dies: that is a server's failure), and `min_workers` (at least one) left
    besides those `lost` before. `exit_code(rank)`: the rank's exit code, None while it
    runs. A moment's wait lets a dying server's exit show first."""
    if any(r == 0 or topology.role(r) == "server"
           or not is_a_loss(exit_code(r), failures.get(r)) for r in failed):
        return False
    time.sleep(SERVER_DEATH_GRACE_S)
    if any(exit_code(s) not in (None, 0) for s in topology.server_ranks):
        return False
    return workers_left(topology, lost, failed) >= max(1, min_workers)


def workers_left(topology, lost: set[int], failed: list[int]) -> int:
    """The workers a run has left once it goes on without the ranks `lost` and `failed`."""
    return topology.workers - len(set(lost) | set(failed))


def going_on_without(code: int, failure: RankFailure | None, log: Path | str) -> str:
    """What a launcher says of a worker the run goes on without, after its name."""
    return f"lost: {how(code, failure, log)}; the others go on"


def mark_training(run_dir: Path) -> None:
    """Leave the mark that training has begun (a worker has taken a step, so every rank is
    past the start, where each waits for all), for a launcher that sees its ranks only as
    processes (a script's); it then may go on without a worker lost. A rank that cannot
    write it trains on, and a worker lost then fails the run."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / "logs" / TRAINING_MARK).touch()


def training_began(run_dir: Path) -> bool:
    """Whether a worker has left the mark (mark_training)."""
    return (Path(run_dir) / "logs" / TRAINING_MARK).exists()


def completed_summary(record: RunRecord) -> dict | None:
    """The run's summary if rank 0 has recorded it completed (its results are in: a rank
    that fails after that, in the instant the job leaves, fails nothing), else None."""
    try:
        return recorded_summary(record)
    except StoreError:
        return None


def left_behind(record: RunRecord) -> set[int]:
    """The ranks of the workers a completed run went on without (its summary's
    lost_workers): a launcher ends those still running, cut off or frozen, which nobody
    waits for any more."""
    summary = completed_summary(record) or {}
    return {lost["rank"] for lost in summary.get("lost_workers") or []}


def _left_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.left"


def mark_left(run_dir: Path, rank: int) -> None:
    """Leave the mark that rank `rank` has done its part and left the job, for a launcher
    that sees only its host's torchrun, which may then wait for a lost host's at its exit
    (launch/launchers/emulated.py)."""
    with contextlib.suppress(OSError):
        _left_path(run_dir, rank).touch()


def mark_joined(run_dir: Path, rank: int, joined: bool = True) -> None:
    """Leave the mark that rank `rank` joined its job (a script's polyrhythm.init()), or,
    `joined` False, that it stepped an optimizer without having joined it."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / "logs" / f"rank{rank}.{'joined' if joined else 'unjoined'}").touch()


def never_joined(run_dir: Path, rank: int, code: int | None,
                 topology) -> RunFailed | None:
    """The run's failure if rank `rank`'s script stepped an optimizer without joining its
    job, or ended well (`code` 0) without having joined it: it never called
    polyrhythm.init(), so it trained alone; None otherwise."""
    logs = Path(run_dir) / "logs"
    if (logs / f"rank{rank}.unjoined").exists() or (
            code == 0 and not (logs / f"rank{rank}.joined").exists()):
        return RunFailed(f"rank {rank} ({topology.describe(rank)}) {NEVER_JOINED}")
    return None


NEVER_JOINED = ("ran the script without joining its job: it never called polyrhythm.init(), "
                "so each process would train alone; call job = polyrhythm.init() first")


def have_left(run_dir: Path, ranks: list[int]) -> bool:
    """Whether every rank of `ranks` has left the mark (mark_left)."""
    return all(_left_path(run_dir, r).exists() for r in ranks)


def cause(failed: list[int], codes: dict[int, int], failures: dict[int, RankFailure]) -> int:
    """The rank whose failure explains the others': one that diverged, then one killed or
    crashed (its peers then fail on the broken connection), one that raised an error of its
    own, one that ended without saying why, one that timed out, and last one that only lost a
    peer (even if it then died); the lowest rank first among equals. `codes`: exit codes
    where known."""
    order = {Kind.DIVERGED: 0, Kind.BUG: 2, Kind.USER: 2, Kind.SILENT: 4, Kind.LOST: 5}

    def rank_key(r: int) -> tuple[int, int]:
        failure = failures.get(r)
        if failure is not None and failure.kind == Kind.DIVERGED:
            return 0, r
        if died_by_itself(codes.get(r), failure):
            return 1, r
        return (3 if failure is None else order[failure.kind]), r

    return min(failed, key=rank_key)


def how(code: int | None, failure: RankFailure | None, log: Path | str) -> str:
    """How a rank ended, from its exit code (None: unknown) and its report, for a line that
    starts with the rank: 'was killed by SIGKILL', 'raised ValueError: ...; traceback in LOG'."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # real-time signals have no name
            name = f"signal {-code}"
        if -code in CRASHES:
            return f"crashed ({name}); its output is in {log}"
        return f"was killed by {name}"
    if failure is None:
        return f"failed: exit code {code}"
    if failure.kind == Kind.BUG:
        return f"raised {failure.error}; traceback in {log}"
    return f"failed: {failure.error}"


def rank_failed(rank: int, code: int | None, failure: RankFailure | None, log: Path | str,
                topology) -> RunFailed:
    """The run failed for what ended rank `rank` (`how` says it; a divergence is its own
    line, and marks the run diverged)."""
    if failure is not None and failure.kind == Kind.DIVERGED:
        return RunFailed(f"{failure.error} ({topology.describe(rank)})", diverged=True)
    return RunFailed(f"rank {rank} ({topology.describe(rank)}) {how(code, failure, log)}")


def recorded_failure(record: RunRecord, exc: BaseException, config=None,
                     script: bool = False) -> RunFailed:
    """Store the run as failed with what ended it; the RunFailed to raise, which says how to
    go on if a checkpoint was written (`config`: the run's, to find it; `script`: a run of
    `polyrhythm run`, resumed by it)."""
    reason = failure_reason(record, exc) + full_disk(record.dir)
    diverged = isinstance(exc, RunFailed) and exc.diverged
    try:
        fail_run(record, reason, "diverged" if diverged else "failed")
    except StoreError as unrecorded:  # the reason is kept in the run's folder: `runs` shows it
        reason = str(unrecorded)
    done = complete_epochs(record.dir, config.workers, config.servers) if config else []
    # A script's epochs are its own (job.epochs(n)), not the config's: whatever checkpoint a
    # failed script run left, the script has not finished after it.
    left = done and not diverged and (script or done[-1] < config.epochs)
    command = "run" if script else "train"
    hint = (f"; `polyrhythm {command} --resume {record.run_id} --out {config.out}` goes on "
            f"after epoch {done[-1]}" if left else "")
    return RunFailed(f"run {record.run_id} {reason}{hint}", record.run_id,
                     interrupted=isinstance(exc, KeyboardInterrupt), diverged=diverged)


def failure_reason(record: RunRecord, exc: BaseException) -> str:
    """What ended the run, in one line. An error of the launcher's own that no user caused
    (a bug in it) leaves its traceback in the run's logs/launcher.log, and the line says so."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted; all processes stopped"
    if isinstance(exc, RunFailed):
        return str(exc) if exc.diverged else f"failed: {exc}"
    line = f"{type(exc).__name__}: {one_line(exc)}"
    if isinstance(exc, PolyrhythmError):
        return f"failed: {line}"
    log = record.dir / "logs" / LAUNCHER_LOG
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as file:
            traceback.print_exception(exc, file=file)
    except OSError as error:
        return (f"failed: the launcher raised {line} (its traceback could not be written to "
                f"{log}: {error.strerror})")
    return f"failed: the launcher raised {line}; traceback in {log}"
