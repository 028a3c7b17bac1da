"""Runs on a Spark cluster: the `mapreduce` strategy (one Spark job per mini-batch, as MLlib
trains) and `--launcher spark` (every rank a Spark barrier task).

The launcher starts a driver process (`python -m polyrhythm.launch.launchers.spark_driver`)
that owns the Spark context and with it every JVM and Python process Spark starts: the gateway JVM,
local-cluster's executors, their Python daemons and workers, and the ranks those run. Each of
them inherits a variable naming the run; when the run ends, fails or is interrupted, the
launcher ends the driver and then every process that still carries the variable, whichever
process group Spark's own children made for themselves (PySpark's daemon makes its own).

What Spark cannot do here is said in one line before a run record exists: no Java, no
pyspark, a master that does not answer, a run its master cannot place (spark_check).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import psutil

from polyrhythm.config.spark import (
    check_placeable,
    executor_memory_of,
    master_of,
    runs_mapreduce,
)
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError, RunFailed
from polyrhythm.launch.process.failures import completed_summary, recorded_failure
from polyrhythm.launch.process.prctl import signal_on_parent_death
from polyrhythm.launch.process.signals import raise_interrupt, signal_handlers
from polyrhythm.launch.process.supervisor import Popened, Supervisor
from polyrhythm.metrics.records import RunRecord, read_summary

RUN_VARIABLE = "POLYRHYTHM_SPARK_RUN"  # every process of a run's Spark carries it
DRIVER_LOG = "spark-driver.log"
ERROR_FILE = "spark-error"  # the driver's one line on what ended the run
GRACE_S = 5.0
JDK_HINT = ("install a Java runtime (Spark 3.5 runs on Java 17: `apt-get install "
            "openjdk-17-jre-headless` on Debian) or set JAVA_HOME")
MASTER_TIMEOUT_S = 3.0
POLL_S = 0.2
SPARK_RESERVED_MB, SPARK_MEMORY_FRACTION = 300, 0.6  # spark.memory.fraction's default


def spark_check(config, source=None) -> None:
    """Everything a Spark run needs that can be known before it starts, as one line: Java,
    pyspark, the run's placement on its master, mapreduce's partitions of `source` (the
    run's data) in its executors' memory, a standalone master that answers."""
    java = (Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME")
            else shutil.which("java"))
    if java is None or not Path(java).is_file():
        raise ConfigError(f"Spark needs Java, and there is no `java` here: {JDK_HINT}")
    try:
        import pyspark  # noqa: F401 (only whether it is there)
    except ImportError:
        raise ConfigError("Spark runs need pyspark: pip install 'polyrhythm[spark]'") from None
    check_placeable(config, os.cpu_count() or 1)
    if source is not None and runs_mapreduce(config):
        partitions_fit(config, len(source.labels()), math.prod(source.shape))
    reachable(master_of(config))


def partitions_fit(config, rows: int, features: int) -> None:
    """mapreduce caches its partitions in the executors' storage memory: Spark's unified
    memory is 60 % of what an executor has beyond its 300 MB reserve, and a partition that
    does not fit is not cached but read again for every mini-batch, silently."""
    memory = executor_memory_of(master_of(config), config.executor_memory)
    storage_mb = (memory - SPARK_RESERVED_MB) * SPARK_MEMORY_FRACTION
    partitions = config.partitions or config.workers
    each_mb = rows * (features * 4 + 8) / partitions / 2**20  # float32 rows, int64 targets
    executors = config.workers
    per_executor_mb = each_mb * math.ceil(partitions / executors)
    if per_executor_mb > storage_mb:
        raise ConfigError(f"mapreduce caches {per_executor_mb:.0f} MB of the training set on "
                          f"each executor, beyond its {storage_mb:.0f} MB of storage memory "
                          f"(executors of {memory} MB): raise --executor-memory or "
                          "--workers")


def reachable(master: str) -> None:
    """A standalone master (spark://HOST:PORT, several for standby masters) must answer: Spark
    itself would retry for a minute before giving up."""
    if not master.startswith("spark://"):
        return
    errors = []
    for address in master[len("spark://"):].split(","):
        url = urlparse(f"spark://{address}")
        try:
            with socket.create_connection((url.hostname or "", url.port or 7077),
                                          timeout=MASTER_TIMEOUT_S):
                return
        except (OSError, ValueError) as exc:
            errors.append(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
    raise ConfigError(f"Spark master {master} is unreachable: {'; '.join(errors)}")


def launch_spark(config, record: RunRecord, show_progress: bool = False) -> dict:
    """Run the job on Spark through a driver process; return the summary or raise RunFailed
    (the run stored as failed). Nothing the run started outlives it. `show_progress`: the
    driver's lines of progress (a line an epoch) on stderr."""
    driver = None
    try:
        with signal_handlers(sigterm=raise_interrupt):
            (record.dir / ERROR_FILE).unlink(missing_ok=True)
            driver = start_driver(config, record)
            DriverSupervisor(Popened(driver, tuple(range(config.world_size)), group=True),
                             config, record, show_progress).run()
        return read_summary(record)
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary
        raise recorded_failure(record, exc, config) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            end_driver(driver, record.run_id)


class DriverSupervisor(Supervisor):
    """The supervisor of the driver process, which runs every rank (spark_ranks.py
    supervises their tasks): its progress lines shown (`show_progress`), its failure as it
    said it."""

    poll_s = POLL_S

    def __init__(self, driver: Popened, config, record: RunRecord, show_progress: bool) -> None:
        super().__init__([driver], Topology(config.servers, config.workers), record)
        self.log, self.shown = record.dir / "logs" / DRIVER_LOG, [0]
        self.show_progress = show_progress

    def look(self) -> None:
        if self.show_progress:
            follow(self.log, self.shown)

    def explain(self, proc: Popened) -> RunFailed:
        return driver_failure(self.record, proc.poll())


def follow(log: Path, shown: list[int]) -> None:
    """Show the progress lines (`[...] epoch ...`) the driver's log gained since `shown[0]`
    bytes."""
    if not log.exists():
        return
    with open(log, "rb") as file:
        file.seek(shown[0])
        new = file.read()
    complete = new[:new.rfind(b"\n") + 1]  # a line still being written waits
    shown[0] += len(complete)
    for line in complete.decode(errors="replace").splitlines():
        if line.startswith("[") and " epoch " in line:
            print(line, file=sys.stderr, flush=True)


def start_driver(config, record: RunRecord) -> subprocess.Popen:
    """The driver process of the run, in a session of its own, its output in the run's
    folder."""
    environment = {**os.environ, RUN_VARIABLE: record.run_id,
                   # The executors' Python: this one, which has torch and polyrhythm.
                   "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if master_of(config).startswith("local"):  # one machine: nothing listens beyond loopback
        environment["SPARK_LOCAL_IP"] = "127.0.0.1"
    with open(record.dir / "logs" / DRIVER_LOG, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "polyrhythm.launch.launchers.spark_driver",
             str(record.dir / "config.toml"), "--run-id", record.run_id,
             "--out", str(record.out.resolve())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=environment,
            start_new_session=True, preexec_fn=_stop_with_launcher)


def _stop_with_launcher() -> None:
    """In the driver, before it runs: SIGTERM when the launcher dies, even by SIGKILL (the
    driver then stops its Spark context and its executors with it)."""
    signal_on_parent_death(signal.SIGTERM)


def driver_failure(record: RunRecord, code: int) -> RunFailed:
    """What ended the run, as the driver said it (whether it diverged too), or how the
    driver itself ended."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        said = json.loads((record.dir / ERROR_FILE).read_text())
        return RunFailed(said["error"], diverged=bool(said["diverged"]))
    log = record.dir / "logs" / DRIVER_LOG
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return RunFailed(f"the Spark driver {how} (log: {log})")


def end_driver(driver: subprocess.Popen | None, run_id: str) -> None:
    """End the driver (SIGTERM: it stops its Spark context; then SIGKILL to its group), then
    every process still carrying the run's variable."""
    if driver is not None and driver.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            driver.wait(GRACE_S)
    if driver is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    end_processes_of(run_id)


def processes_of(run_id: str) -> list[psutil.Process]:
    """The processes that carry run `run_id`'s variable (this one excepted)."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get(RUN_VARIABLE) == run_id:
                found.append(process)
    return found


def end_processes_of(run_id: str, wait_s: float = GRACE_S) -> None:
    """Kill whatever of the run's Spark is left, and wait until it is gone."""
    left = processes_of(run_id)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=wait_s)
    deadline = time.monotonic() + wait_s
    while processes_of(run_id) and time.monotonic() < deadline:  # started while killing
        for process in processes_of(run_id):
            with contextlib.suppress(psutil.Error):
                process.kill()
        time.sleep(0.05)
