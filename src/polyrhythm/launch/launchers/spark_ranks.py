"""`--launcher spark`: every rank of the job a Spark barrier task (any strategy but
mapreduce), run by the driver process (launch/launchers/spark_driver.py) on its Spark context.

A barrier stage starts all its tasks at once, as a job's ranks must (each waits for all at
its start), and gives them a rendezvous: each task (launch/launchers/spark_task.py) starts its rank,
`python -m polyrhythm.node`, with torchrun's variables and rank 0's host and port, so the
ranks run exactly as under torchrun or on an emulated cluster. Rank 0 completes the run
record the launcher made (--run-id), in the run's store: the ranks read the config with the
paths the driver resolved, as executors run in Spark's own folders.

A task returns its rank's exit code rather than raising (Spark would retry a failed task, or
say only that it failed). The driver watches the codes as tasks end, with the supervisor
every launcher uses (launch/process/supervisor.py, each task a rank's handle): once a rank
has failed, it gives the rank that explains the failure a moment to show (a killed rank's peers can
report the broken connection first), then cancels the job, which ends every other task and
with it its rank, as torchrun stops the surviving ranks. The failure is then said as the
other launchers say it (launch/process/failures.py), from the ranks' reports and exit codes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time

from polyrhythm.context import Topology
from polyrhythm.errors import RunFailed
from polyrhythm.launch.launchers.spark import GRACE_S, RUN_VARIABLE
from polyrhythm.launch.launchers.spark_driver import spark_failure
from polyrhythm.launch.launchers.spark_task import EndedRanks, RankTask
from polyrhythm.launch.process.failures import (
    cause,
    clear_reports,
    died_by_itself,
    lost_a_peer,
    rank_failed,
    read_reports,
)
from polyrhythm.launch.process.supervisor import Supervisor
from polyrhythm.launch.rank.gate import SECRET_VARIABLE, new_secret
from polyrhythm.metrics.records import RunRecord

SPARK_CONFIG = "spark-config.toml"  # in the run's folder: the config the ranks read
POLL_S = 0.2
# Which task failed, as Spark says it: a barrier stage's ResultTask(stage, partition), any
# other's "Lost task PARTITION.ATTEMPT"; a task's partition is its rank.
_FAILED_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)|Lost task (\d+)\.\d+ in stage")
SLOTS_WAIT_S = 120.0  # for the executors to register; then Spark's own check decides
CANCEL_WAIT_S = 10.0  # for a cancelled job's tasks to end (Spark kills their workers in 2 s)


def run_ranks(context, config, record: RunRecord) -> None:
    """Run every rank of the run as a barrier task on `context`; return once all have
    ended well (rank 0 has completed the record), else raise RunFailed naming the rank
    that explains the failure (or Spark's own error, if no rank does)."""
    clear_reports(record.dir)  # an earlier launch's, which would name its failures
    resolved = record.dir / SPARK_CONFIG
    resolved.write_text(config.to_toml())
    ended = context.accumulator([], EndedRanks())
    task = RankTask(str(resolved), record.run_id, str(record.dir / "logs"), os.getcwd(),
                    {RUN_VARIABLE: record.run_id, SECRET_VARIABLE: new_secret()}, ended)
    await_slots(context, config.world_size)
    job = BarrierJob(context, task, config.world_size)
    ranks = [SparkRank(rank, job, lambda: dict(ended.value)) for rank in range(config.world_size)]
    topology = Topology(config.servers, config.workers)
    try:
        SparkSupervisor(ranks, job, topology, record).run()
    except BaseException:
        job.stop(wait=False)  # interrupted: the context's stop ends the rest
        raise
    job.stop()
    codes = ranks[0].codes()
    if len(codes) < config.world_size or any(codes.values()):  # Spark failed the job
        raise SparkSupervisor.failure(job, codes, read_reports(record.dir), topology, record)


class SparkRank:
    """A rank's barrier task as the supervisor holds a rank's process
    (launch/process/supervisor.py): its exit code once the driver has it (`ended()`: the
    codes so far, a task's as it ends); ending one ends the job, every task with it."""

    pid = None

    def __init__(self, rank: int, job: BarrierJob, ended) -> None:
        self.rank, self.ranks, self.job, self._ended = rank, (rank,), job, ended

    def codes(self) -> dict[int, int]:
        return {**self._ended(), **(self.job.codes or {})}

    def poll(self) -> int | None:
        return self.codes().get(self.rank)

    def wait(self, timeout: float | None = None) -> int | None:
        self.job.thread.join(timeout)
        return self.poll()

    def terminate(self) -> None:
        self.job.stop(wait=False)

    def kill(self) -> None:
        self.job.stop()


class SparkSupervisor(Supervisor):
    """The supervisor of the ranks' Spark tasks; the run is over when Spark's job is,
    whatever codes came back (a task Spark failed returns none)."""

    grace_s = GRACE_S
    poll_s = POLL_S

    def __init__(self, ranks: list[SparkRank], job: BarrierJob, topology: Topology,
                 record: RunRecord) -> None:
        super().__init__(ranks, topology, record)
        self.job = job

    def done(self) -> bool:
        return self.job.done()

    def explain(self, proc: SparkRank) -> RunFailed:
        self.job.stop()
        return self.failure(self.job, proc.codes(), self.reports(), self.topology, self.record)

    @staticmethod
    def failure(job: BarrierJob, codes: dict[int, int], reports: dict, topology: Topology,
                record: RunRecord) -> RunFailed:
        """What ended the run: a rank that explains it, else Spark's own error."""
        if job.failed():  # Spark's own words, in full, for the driver's log
            print(f"the ranks' Spark job failed: {job.error}", file=sys.stderr, flush=True)
            if not explained(codes, reports):  # a task failed, not its rank
                return task_failure(job.error, topology)
        return ranks_failure(codes, reports, topology, record)


def await_slots(context, world: int) -> None:
    """Wait until the executors registered have a core for every rank (at most SLOTS_WAIT_S).
    A barrier job submitted before then fails Spark's check of its slots and is tried again
    only 15 s later (spark.scheduler.barrier.maxConcurrentTasksCheck.interval), and
    local-cluster's executors register seconds after the context starts: waiting saved 8 s
    a run here. defaultParallelism is their cores (at least 2)."""
    deadline = time.monotonic() + SLOTS_WAIT_S
    while context.defaultParallelism < world and time.monotonic() < deadline:
        time.sleep(POLL_S)


class BarrierJob:
    """The ranks' barrier stage, collected in a thread of its own: the driver's main thread
    watches the ranks meanwhile, and takes the launcher's SIGTERM at once."""

    def __init__(self, context, task: RankTask, world: int) -> None:
        self.context = context
        self.codes: dict[int, int] | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        stage = context.parallelize(range(world), world).barrier().mapPartitions(task)
        self.thread = threading.Thread(target=self._collect, args=(stage,),
                                       name="spark-ranks", daemon=True)
        self.thread.start()

    def _collect(self, stage) -> None:
        try:
            self.codes = dict(stage.collect())
        except BaseException as exc:  # Spark's, said by the driver if no rank explains it
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()

    def failed(self) -> bool:
        """Whether the job failed in Spark (not cancelled here): a task raised, or its
        Python worker or executor was lost."""
        return self.error is not None and not self.cancelled

    def stop(self, wait: bool = True) -> None:
        """Cancel the job if it still runs (Spark ends its tasks' Python workers, and their
        ranks die with them); `wait`: until it has ended."""
        if self.done():
            return
        self.cancelled = True
        with contextlib.suppress(Exception):  # a context already stopping
            self.context.cancelAllJobs()
        if wait:
            self.thread.join(CANCEL_WAIT_S)


def explained(codes: dict[int, int], reports: dict) -> bool:
    """Whether a rank explains a failure by itself: killed or crashed (a negative code) without
    having lost a peer first, or failed on anything but a lost or silent peer."""
    return (any(died_by_itself(code, reports.get(r)) for r, code in codes.items())
            or any(not lost_a_peer(f) for f in reports.values()))


def ranks_failure(codes: dict[int, int], reports: dict, topology: Topology,
                  record: RunRecord) -> RunFailed:
    """What ended the run, from the rank that explains the others' failures (failures.py's
    cause), with its exit code and report."""
    failed = sorted({r for r, code in codes.items() if code} | set(reports))
    if not failed:  # cannot be: the job is cancelled only once a rank has failed
        return RunFailed(f"the ranks' Spark job ended with exit codes {codes}")
    first = cause(failed, codes, reports)
    return rank_failed(first, codes.get(first), reports.get(first), record.log_path(first),
                       topology)


def task_failure(error: BaseException, topology: Topology) -> RunFailed:
    """A rank's Spark task failed, not the rank (its Python worker or executor was lost, and
    the rank died with it): Spark's error in one line, with the rank where Spark names its
    task."""
    said = spark_failure(error)
    found = _FAILED_TASK.search(str(error))
    if found is None:
        return RunFailed(said)
    rank = int(found.group(1) or found.group(2))
    return RunFailed(f"rank {rank} ({topology.describe(rank)}): {said}")
