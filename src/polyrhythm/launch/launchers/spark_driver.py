"""The driver process of a run on Spark (launch/launchers/spark.py starts it):

    python -m polyrhythm.launch.launchers.spark_driver runs/RUN_ID/config.toml \
        --run-id RUN_ID --out DIR

It opens the Spark context on the run's master and runs the job: the `mapreduce` strategy's
jobs (launch/launchers/mapreduce.py), or every rank of any other strategy as a barrier task
(launch/launchers/spark_ranks.py). What ended a failed run goes, in one line, to the run's
`spark-error` file for the launcher; SIGTERM stops the context first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from polyrhythm.config import load_config
from polyrhythm.config.spark import executor_memory_of, master_of, runs_mapreduce
from polyrhythm.errors import Diverged, PolyrhythmError, one_line
from polyrhythm.launch.launchers.spark import ERROR_FILE
from polyrhythm.launch.process.signals import raise_interrupt
from polyrhythm.metrics.records import RunRecord

# Spark's own settings for a run: no web UI or console progress bars (the launcher shows
# progress), a failed task ends the job at once (a rank's or a mini-batch's failure is the
# run's; retrying it would train twice), executors of one core keep one torch thread.
CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.task.maxFailures": "1",
    "spark.stage.maxConsecutiveAttempts": "1",
    "spark.executorEnv.OMP_NUM_THREADS": "1",
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "1g",
}


@contextlib.contextmanager
def spark_context(config, app: str, logs: Path) -> Iterator:
    """The run's SparkContext on its master; stopped after, and its gateway JVM with it (a
    stopped context leaves the JVM running until this process ends). local-cluster's
    executors write their logs into pyspark's own folder: they move to `logs`."""
    import pyspark
    from pyspark import SparkConf, SparkContext

    master = master_of(config)
    conf = SparkConf().setMaster(master).setAppName(app).setAll(list(CONF.items()))
    conf.set("spark.executor.memory", f"{executor_memory_of(master, config.executor_memory)}m")
    conf.setAll([tuple(part.strip() for part in item.split("=", 1))
                 for item in config.spark_conf])
    context = SparkContext(conf=conf)
    context.setLogLevel("ERROR")
    executors = Path(pyspark.__file__).parent / "work" / context.applicationId
    try:
        yield context
    finally:
        gateway = SparkContext._gateway
        with contextlib.suppress(Exception):
            context.stop()
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()
            process = getattr(gateway, "proc", None)
            if process is not None:  # it ends when its stdin closes
                with contextlib.suppress(Exception):
                    process.stdin.close()
                    process.wait(10)
        SparkContext._gateway = SparkContext._jvm = None
        if master.startswith("local-cluster") and executors.is_dir():
            with contextlib.suppress(OSError):
                shutil.move(executors, logs / "spark-executors")


def run_driver(config_path: str, run_id: str, out: str) -> None:
    config = load_config(config_path, out=out)
    path = config.data.get("data_path")
    if path and not Path(path).is_absolute():  # executors run in Spark's folders, not here
        config = load_config(config_path, out=out, data_path=str(Path(path).resolve()))
    record = RunRecord(Path(out), run_id)
    with spark_context(config, f"polyrhythm {run_id}", record.dir / "logs") as context:
        try:
            if runs_mapreduce(config):
                from polyrhythm.launch.launchers.mapreduce import train_mapreduce
                train_mapreduce(context, config, record)
            else:
                from polyrhythm.launch.launchers.spark_ranks import run_ranks
                run_ranks(context, config, record)
        except (PolyrhythmError, KeyboardInterrupt):
            raise
        except Exception as exc:  # said while the JVM that holds its text still runs
            raise SparkFailed(spark_failure(exc)) from exc


class SparkFailed(PolyrhythmError):
    """A Spark job of the run failed: what its task raised, in one line."""


# The last line of a Python traceback: its exception and message.
_RAISED = re.compile(r"^([\w.]+(?:Error|Exception|Exit|Interrupt|Diverged|Failed)): (.*)$")


def spark_failure(exc: BaseException) -> str:
    """What a failed Spark job says, in one line: the exception its Python task raised (the
    last of the tracebacks Spark's error carries), else Spark's own first line."""
    text = str(exc)
    raised = [m for m in map(_RAISED.match, text.splitlines()) if m]
    if raised:
        name, message = raised[-1].groups()
        return f"a Spark task raised {name.rsplit('.', 1)[-1]}: {message.strip()}"
    return f"Spark failed: {type(exc).__name__}: {one_line(exc)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyrhythm.launch.launchers.spark_driver")
    parser.add_argument("config")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--out", required=True, help="the store's folder, absolute")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)
    error = RunRecord(Path(args.out), args.run_id).dir / ERROR_FILE
    try:
        run_driver(args.config, args.run_id, args.out)
        return 0
    except KeyboardInterrupt:
        say(error, "interrupted; all processes stopped")
        return 130
    except PolyrhythmError as exc:
        diverged = isinstance(exc, Diverged) or getattr(exc, "diverged", False)
        say(error, str(exc), diverged)
        return 1
    except Exception as exc:  # Spark's or a bug: its traceback stays in the driver's log
        traceback.print_exc()
        say(error, f"the Spark driver raised {type(exc).__name__}: {one_line(exc)} "
                   "(traceback in logs/spark-driver.log)")
        return 1


def say(error: Path, line: str, diverged: bool = False) -> None:
    """Leave the launcher what ended the run (launch/launchers/spark.py driver_failure reads it)."""
    error.write_text(json.dumps({"error": one_line(Exception(line)), "diverged": diverged}))

if __name__ == "__main__":
    sys.exit(main())
