"""`polyrhythm run`: a user's script as a job on this machine. Every rank is the script in a
process of its own, as `python script.py args` would run it but forked with torch loaded
(launch/rank/preloaded.py), told its rank, the run's config and record, and a file to meet
the others at (launch/rank/script_rank.py reads them); worker 0's output is shown, every
rank's is kept in the run's logs. A rank that fails ends the run: every other process is
stopped, and the run is recorded as failed with the failing rank, its error and the script's
line (the rank's own report). Only a worker lost during training (killed, or cut off from
its peers) is gone without ending it, where the run says on_worker_failure = continue: the
same rules and the same supervisor as polyrhythm train's (launch/process/supervisor.py),
training under way once a worker has taken a step (its mark in the run's logs). Ctrl-C and
SIGTERM end it too.
No process outlives the run: each dies with its launcher too.

The launcher keeps what started the script (`script.json` in the run's folder: the script's
absolute path, its arguments and the folder it ran in), so that `polyrhythm run --resume`
starts the same script the same way; the resumed ranks learn the checkpoint to go on from.

On an emulated cluster (`hosts` set) the script is what each host's torchrun runs
(`script_on_cluster`, for launch/launchers/emulated.py, which supervises and ends the run as it does
`polyrhythm train`'s).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
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
    clear_reports,
    completed_summary,
    never_joined,
    recorded_failure,
)
from polyrhythm.launch.process.forkserver import CHILD_ENVIRONMENT
from polyrhythm.launch.process.signals import GRACE_S, raise_interrupt, signal_handlers
from polyrhythm.launch.process.supervisor import Supervisor, stop
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
            ScriptSupervisor(procs, topology, record, show,
                             carry_on=config.on_worker_failure == CONTINUE,
                             min_workers=config.min_workers).run()
        for reader in readers:
            reader.join()
        return read_summary(record)
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary  # a rank lost once the run was recorded, as the job left
        raise recorded_failure(record, exc, config, script=True) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            stop(procs)
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


class ScriptSupervisor(Supervisor):
    """The supervisor of a script's ranks (launch/process/supervisor.py): their reports and
    the mark that training has begun are in the run's logs; a rank that ends well without
    having joined its job ends the run; a worker the run goes on without is said on
    `show`."""

    def __init__(self, procs: list[ScriptRank], topology: Topology, record: RunRecord,
                 show: TextIO, carry_on: bool, min_workers: int = 1) -> None:
        super().__init__(procs, topology, record, carry_on, min_workers)
        self.show = show

    def ended(self, proc: ScriptRank, code: int) -> None:
        (rank,) = proc.ranks
        if (unjoined := never_joined(self.record.dir, rank, code, self.topology)) is not None:
            stop(self.procs)
            raise unjoined

    def say_lost(self, ranks: list[int], line: str) -> None:
        _say(self.show, f"{self.topology.describe(ranks[0])} {line}")


def _say(show: TextIO, line: str) -> None:
    """A line of the launcher's own among worker 0's output."""
    show.write(f"polyrhythm: {line}\n")
    show.flush()
