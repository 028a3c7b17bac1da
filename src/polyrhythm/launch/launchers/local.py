"""The local launcher: starts every rank on loopback, supervises them, tears them all down.

Ranks are forked from a multiprocessing forkserver that has imported torch and the runtime
once, so a rank starts in milliseconds rather than importing torch (3 s of CPU each, all
ranks at once on the same cores); the forkserver stays up for the launcher's later runs. It
forks from a process that has run no torch operation, so no OpenMP pool or Gloo state is
copied.

The ranks meet through a file store in the run's folder: no port race, and nothing listens
beyond loopback (Gloo binds 127.0.0.1; a TCP store would listen on every interface). Any rank
failing, Ctrl-C or SIGTERM ends every process (launch/process/supervisor.py watches them);
ranks also leave the moment the launcher is gone (they watch a pipe only the launcher
holds), and then the forkserver exits too, so no process outlives the run.
"""

from __future__ import annotations

import signal

from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import Topology
from polyrhythm.errors import RunFailed
from polyrhythm.launch.launchers.progress import ProgressBoard
from polyrhythm.launch.process import forkserver
from polyrhythm.launch.process.events import RankEvents
from polyrhythm.launch.process.failures import RankFailure, completed_summary, recorded_failure
from polyrhythm.launch.process.signals import raise_interrupt, signal_handlers
from polyrhythm.launch.process.supervisor import Forked, Supervisor, stop
from polyrhythm.launch.rank.forked import process_name, rank_main
from polyrhythm.metrics.records import RunRecord, read_summary
from polyrhythm.runtime.checkpoint import Resume, tidy

RENDEZVOUS_FILE = "rendezvous"


def launch_local(config, record: RunRecord, progress: ProgressBoard | None = None,
                 resume: Resume | None = None) -> dict:
    """Run the job in local processes; return the summary or raise RunFailed.

    Whatever ends the run early (a rank failing, Ctrl-C, SIGTERM, an error here) stops every
    process and stores the run as failed with a one-line reason (a bug's traceback is in the
    log it names).
    """
    topology = Topology(config.servers, config.workers)
    board = progress or ProgressBoard(config.workers, enabled=False)
    procs: list = []
    pipe: tuple = ()
    events: RankEvents | None = None
    try:
        with signal_handlers(sigterm=raise_interrupt):
            rendezvous = record.dir / RENDEZVOUS_FILE
            rendezvous.unlink(missing_ok=True)  # a resumed run's old one
            ctx = forkserver.context()
            events = RankEvents(ctx, topology.world_size)  # a pipe each (launch/process/events.py)
            # Nobody writes into `alive`: a rank that reads end-of-file knows its launcher is
            # gone.
            alive, alive_w = pipe = ctx.Pipe(duplex=False)
            procs = [ctx.Process(target=rank_main, name=process_name(rank),
                                 args=(config.to_dict(), rank, str(rendezvous), record,
                                       events.senders[rank], alive, resume))
                     for rank in range(topology.world_size)]
            with forkserver.child_environment():
                events.start(procs)
            LocalSupervisor(_held(procs), events, board, topology, record,
                            carry_on=config.on_worker_failure == CONTINUE,
                            min_workers=config.min_workers).run()
        return read_summary(record)
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary  # a rank lost once the run was recorded, as the job left
        # Said in one line; a bug of the launcher's own keeps its traceback in the run's logs.
        raise recorded_failure(record, exc, config) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):  # teardown must finish
            stop(_held(procs))
            for end in pipe:
                end.close()
            if events is not None:
                events.close()
            (record.dir / RENDEZVOUS_FILE).unlink(missing_ok=True)
            # No rank writes any more: a failed run keeps the last two complete checkpoints,
            # to resume from (a completed one has been tidied by its rank 0 already).
            tidy(record.dir, config.workers, config.servers, completed=False)


def _held(procs: list) -> list[Forked]:
    """The ranks' processes that have started, as the supervisor holds them."""
    return [Forked(p, (rank,)) for rank, p in enumerate(procs) if p.pid is not None]


class LocalSupervisor(Supervisor):
    """The supervisor of the local launcher's ranks (launch/process/supervisor.py): their
    failures and progress come as events, drawn on the progress `board`; training has
    begun once a worker reports progress."""

    def __init__(self, procs: list, events: RankEvents, board: ProgressBoard,
                 topology: Topology, record: RunRecord, carry_on: bool = False,
                 min_workers: int = 1) -> None:
        super().__init__(procs, topology, record, carry_on, min_workers)
        self.events, self.board = events, board
        self.failures: dict[int, RankFailure] = {}
        self.trained = False

    def reports(self) -> dict[int, RankFailure]:
        return self.failures

    def training(self) -> bool:
        return self.trained

    def look(self) -> None:
        for event in self.events.take():
            if "failure" in event:
                failure = RankFailure.from_dict(event["failure"])
                self.failures[failure.rank] = failure
            else:
                self.board.update(event)
                self.trained = True
        self.board.draw()

    def say_lost(self, ranks: list[int], line: str) -> None:
        self.board.lines[self.topology.worker_index(ranks[0])] = line

    def run(self) -> None:
        super().run()
        self.board.draw(force=True)
