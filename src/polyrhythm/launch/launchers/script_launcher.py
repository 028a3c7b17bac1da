"""`polyrhythm run`: a user's script as a job on this machine. Every rank is the script in a
process of its own, as `python script.py args` would run it but forked with torch loaded
(launch/rank/preloaded.py), told its rank, the run's config and record, and a file to meet
the others at (launch/rank/script_rank.py reads them); worker 0's output is shown, every
rank's is kept in the run's logs. A rank that fails ends the run: every other process is
stopped, and the run is recorded as failed with the failing rank, its error and the script's
line (the rank's own report). Only a worker lost during training (killed, or cut off from
its peers) is gone without ending it, where the run says on_worker_failure = continue: the
same rules as polyrhythm train's (launch/process/failures.py's goes_on_without), training under way
once a worker has taken a step (its mark in the run's logs). Ctrl-C and SIGTERM end it too.
No process outlives the run: each dies with its launcher too.

The launcher keeps what started the script (`script.json` in the run's folder: the script's
absolute path, its arguments and the folder it ran in), so that `polyrhythm run --resume`
starts the same script the same way; the resumed ranks learn the checkpoint to go on from.

On an emulated cluster (`hosts` set) the script is what each host's torchrun runs
(`script_on_cluster`, for launch/launchers/emulated.py, which supervises and ends the run as it does
`polyrhythm train`'s).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from polyrhythm.config import given_to_a_script
from polyrhythm.config.emulation import host_ranks
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError, RunFailed, StoreError
from polyrhythm.files import read_regular
from polyrhythm.launch.launchers.emulated import RankProgram
from polyrhythm.launch.process import forkserver
from polyrhythm.launch.process.failures import (
    cause,
    clear_reports,
    completed_summary,
    goes_on_without,
    going_on_without,
    left_behind,
    lost_a_peer,
    never_joined,
    rank_failed,
    read_reports,
    recorded_failure,
    training_began,
)
from polyrhythm.launch.process.forkserver import CHILD_ENVIRONMENT
from polyrhythm.launch.process.signals import GRACE_S, raise_interrupt, signal_handlers
from polyrhythm.launch.rank.preloaded import ScriptRank
from polyrhythm.launch.rank.script_rank import (
    ENV_CONFIG,
    ENV_GIVEN,
    ENV_RENDEZVOUS,
    ENV_RESUME,
    ENV_RESUME_SERVERS,
    ENV_RUN_ID,
)
from polyrhythm.metrics.records import RunRecord, read_summary
from polyrhythm.runtime.checkpoint import Resume, resumed_config, tidy
from polyrhythm.runtime.job import thread_count

SCRIPT_FILE = "script.json"  # in the run's folder: what started the script (ScriptCall)
MAX_SCRIPT_FILE_BYTES = 2**20  # a path, its arguments and a folder


@dataclass(frozen=True)
class ScriptCall:
    """How a script run's ranks start: `python script *args`, in the folder `cwd` (the
    arguments may name files relative to it)."""

    script: str  # absolute
    args: list[str]
    cwd: str

    @classmethod
    def here(cls, script: str | Path, args: list[str]) -> ScriptCall:
        """The script started from this process's folder, as `polyrhythm run` starts it."""
        return cls(os.path.abspath(script), list(args), os.getcwd())

    def remember(self, run_dir: Path) -> None:
        (Path(run_dir) / SCRIPT_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def recalled(cls, run_dir: Path) -> ScriptCall | None:
        """The script run `run_dir` holds; None for a run of `polyrhythm train`'s job. A
        script.json that is not what `remember` wrote is a one-line StoreError."""
        path = Path(run_dir) / SCRIPT_FILE
        if not os.path.lexists(path):
            return None
        data = read_regular(path, "script file", StoreError, MAX_SCRIPT_FILE_BYTES)
        try:
            values = json.loads(data)
        except (ValueError, RecursionError):  # not UTF-8 or not JSON; nested too deep
            values = None
        fields = {"script": str, "args": list, "cwd": str}
        if not (isinstance(values, dict) and values.keys() == fields.keys()
                and all(isinstance(values[k], kind) for k, kind in fields.items())
                and all(isinstance(a, str) for a in values["args"])):
            raise StoreError(f"{str(path)!r} is damaged: it must hold the script, its args "
                             "and the folder it ran in (cwd), as `polyrhythm run` wrote them")
        return cls(**values)

    def check(self, run_id: str) -> None:
        """One line unless the script and its folder are still there to start again."""
        if not Path(self.script).is_file():
            raise ConfigError(f"run {run_id}'s script {self.script!r} is not there any more: "
                              "put it back to resume the run")
        if not Path(self.cwd).is_dir():
            raise ConfigError(f"run {run_id}'s script ran in {self.cwd!r}, which is not there "
                              "any more: make it again to resume the run")


def launch_script(config, record: RunRecord, call: ScriptCall, show: TextIO | None = None,
                  resume: Resume | None = None) -> dict:
    """Run `call`'s script as every rank of the job (resuming: from `resume`, with `config`
    as the resume changed it); the run's summary, or RunFailed. Worker 0's output and the
    launcher's lines go to `show` (sys.stdout as it is now, by default)."""
    show = show or sys.stdout
    topology = Topology(config.servers, config.workers)
    procs: list[ScriptRank] = []
    pipe: tuple = ()
    readers: list[threading.Thread] = []
    run_dir = record.dir.resolve()  # the ranks run in `call.cwd`: absolute paths for them
    rendezvous = run_dir / "rendezvous"
    try:
        with signal_handlers(sigterm=raise_interrupt):
            rendezvous.unlink(missing_ok=True)
            (run_dir / "logs").mkdir(exist_ok=True)
            clear_reports(run_dir)  # an earlier launch's, which would name its failures
            job = {**_job(config, run_dir, call, resume, record),
                   ENV_RENDEZVOUS: str(rendezvous)}
            # Nobody writes into `alive`: a rank that reads end-of-file knows its launcher
            # is gone.
            alive, alive_w = pipe = forkserver.context().Pipe(duplex=False)
            for rank in range(topology.world_size):
                procs.append(ScriptRank(call.script, call.args, call.cwd,
                                        _environment(config, topology, rank, job), rank, alive))
            first_worker = topology.worker_ranks[0]
            for rank, proc in enumerate(procs):
                readers.append(_copy_output(proc, record.log_path(rank),
                                            show if rank == first_worker else None))
            _supervise(procs, topology, record, show,
                       carry_on=config.on_worker_failure == CONTINUE)
        for reader in readers:
            reader.join()
        return read_summary(record)
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary  # a rank lost once the run was recorded, as the job left
        raise recorded_failure(record, exc, config, script=True) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            _stop(procs)
            for end in pipe:
                end.close()
            rendezvous.unlink(missing_ok=True)
            # No rank writes any more: a failed run keeps the last two complete checkpoints,
            # to resume from (a completed one has been tidied by its rank 0 already).
            tidy(run_dir, config.workers, config.servers, completed=False)
            # A failed rank's last words (its traceback, which the error points at) reach
            # its log before the launcher says where it is; a process the script started,
            # holding the output open, delays it no more than this.
            for reader in readers:
                reader.join(GRACE_S)


def _job(config, run_dir: Path, call: ScriptCall, resume: Resume | None,
         record: RunRecord) -> dict[str, str]:
    """What every rank finds in its environment: the run's id and the config file it reads
    (the record's own, which a first launch writes its call beside; a resumed launch's,
    which may have other servers or checkpoints, its own) and, resuming, the checkpoint."""
    if resume is None:
        call.remember(run_dir)
        return {ENV_CONFIG: str(run_dir / "config.toml"), ENV_RUN_ID: record.run_id,
                ENV_GIVEN: ",".join(sorted(given_to_a_script(config)))}
    return {ENV_CONFIG: str(resumed_config(config, run_dir)), ENV_RUN_ID: record.run_id,
            ENV_RESUME: str(resume.folder.resolve()), ENV_RESUME_SERVERS: str(resume.servers)}


def script_on_cluster(config, record: RunRecord, call: ScriptCall, show=None,
                      resume: Resume | None = None) -> RankProgram:
    """`call`'s script as every rank of a job on an emulated cluster, told the run's config
    and record (and, resumed, the checkpoint `resume`); worker 0's output is shown on `show`
    (sys.stdout as it is now) as on loopback, every rank's is kept in its host's log, each
    line marked with the rank's place on its host."""
    show = show or sys.stdout
    layout = host_ranks(config.cluster, config.servers, config.workers)
    topology = Topology(config.servers, config.workers)
    first = topology.worker_ranks[0]
    first_host = next(h for h, ranks in enumerate(layout) if first in ranks)
    label = f"[default{layout[first_host].index(first)}]:"  # torchrun's mark of its lines
    job = _job(config, record.dir.resolve(), call, resume, record)

    def environment(host: int) -> dict[str, str]:
        return {**job, "OMP_NUM_THREADS": str(_threads(config, topology, layout[host]))}

    def show_first_worker(host: int, line: str) -> None:
        if host == first_host and line.startswith(label):
            show.write(line[len(label):] + "\n")
            show.flush()

    return RankProgram((call.script, *call.args), environment, True, show_first_worker,
                       script=True)


def _threads(config, topology: Topology, ranks: list[int]) -> int:
    """Torch threads of the ranks `ranks`, which share a host: its workers share its cores
    (servers mostly wait: a host of servers alone gives them 1)."""
    workers = [r for r in ranks if topology.role(r) == "worker"]
    if not workers:
        return thread_count(config, "server", 0)
    return thread_count(config, "worker", len(workers), workers[0])


def _environment(config, topology: Topology, rank: int, job: dict[str, str]) -> dict[str, str]:
    threads = _threads(config, topology, [rank] if topology.role(rank) == "server"
                       else topology.worker_ranks)
    return {**CHILD_ENVIRONMENT, **os.environ,  # a value the user set is kept
            "RANK": str(rank), "WORLD_SIZE": str(topology.world_size),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(topology.world_size),
            "OMP_NUM_THREADS": str(threads), **job, "PYTHONUNBUFFERED": "1"}


def _copy_output(proc: ScriptRank, log: Path, show) -> threading.Thread:
    """Copy a rank's output into its log (and onto `show`) as it comes."""
    def copy() -> None:
        with open(log, "ab") as file:
            for line in proc.stdout:
                file.write(line)
                file.flush()
                if show is not None:
                    show.write(line.decode(errors="replace"))
                    show.flush()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _supervise(procs: list[ScriptRank], topology: Topology, record: RunRecord,
               show: TextIO, carry_on: bool) -> None:
    """Wait for every rank; the first to fail ends the run (RunFailed naming it), unless it
    is a worker lost during training that the run may `carry_on` without (said on `show`)."""
    running = set(range(len(procs)))
    lost: set[int] = set()
    while running:
        if carry_on and procs[0].poll() == 0:  # the run is recorded: nobody waits for a
            for rank in left_behind(record) - lost:  # worker it went on without that runs
                if procs[rank].poll() is None:
                    lost.add(rank)
                    procs[rank].kill()
        for rank in sorted(running):
            code = procs[rank].poll()
            if code is None:
                continue
            running.discard(rank)
            if rank in lost:
                continue
            if (unjoined := never_joined(record.dir, rank, code, topology)) is not None:
                _stop(procs)
                raise unjoined
            if code == 0:
                continue
            reports = read_reports(record.dir)
            if carry_on and training_began(record.dir) and goes_on_without(
                    [rank], lambda r: procs[r].poll(), reports, topology, lost):
                lost.add(rank)
                _say(show, f"{topology.describe(rank)} "
                     f"{going_on_without(code, reports.get(rank), record.log_path(rank))}")
                continue
            raise _failure(procs, rank, topology, record, lost)
        if running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[min(running)].wait(timeout=0.1)


def _say(show: TextIO, line: str) -> None:
    """A line of the launcher's own among worker 0's output."""
    show.write(f"polyrhythm: {line}\n")
    show.flush()


def _failure(procs: list[ScriptRank], rank: int, topology: Topology,
             record: RunRecord, lost: set[int]) -> RunFailed:
    """The rank that explains the run's end, among those that ended by themselves (not
    stopped here) or reported an error, the workers the run went on without left out:
    launch/process/failures.py's `cause`."""
    if lost_a_peer(read_reports(record.dir).get(rank)):
        _await_another_failure(procs, record, lost)
    codes = {r: p.returncode for r, p in enumerate(procs)
             if r not in lost and p.poll() is not None and p.returncode != 0}
    _stop(procs)
    reports = {r: f for r, f in read_reports(record.dir).items() if r not in lost}
    first = cause(sorted(set(codes) | set(reports)), codes, reports)
    return rank_failed(first, codes.get(first), reports.get(first), record.log_path(first),
                       topology)


def _await_another_failure(procs: list[ScriptRank], record: RunRecord,
                           lost: set[int]) -> None:
    """Give the ranks GRACE_S for one to end with an error of its own, not a lost peer (a
    script that fails on a worker can take longer to end than its peers take to see its
    connection go), so the cause is read from the rank that failed, not from its peers (nor
    from a worker `lost` before)."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        reports = read_reports(record.dir)
        if any(r not in lost and p.poll() not in (None, 0) and not lost_a_peer(reports.get(r))
               for r, p in enumerate(procs)):
            return
        running = [p for p in procs if p.poll() is None]
        if not running:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=0.1)  # the others are looked at again every 0.1 s


def _stop(procs: list[ScriptRank]) -> None:
    """SIGTERM every rank still running, SIGKILL those left after the grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
