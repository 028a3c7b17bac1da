"""Where a run's processes start: the local launcher (loopback or an emulated cluster) or a
Spark cluster (`launcher = "spark"`: every rank a barrier task; the `mapreduce` strategy
always runs on Spark, as MLlib trains). The Spark settings say which cluster and how big its
executors are."""

from __future__ import annotations

import re

from polyrhythm.errors import ConfigError
from polyrhythm.limits import MAX_PARTITIONS, MAX_SPARK_MB
from polyrhythm.settings import Param, Rule, at_least, one_of

# Spark refuses executors under 1.5 x its 300 MB reserve (UnifiedMemoryManager): say so
# before a run, not after an executor fails to start.
MIN_EXECUTOR_MEMORY_MB = 450

SPARK = (
    Param("launcher", str, "where the ranks start: local (this machine: loopback, or an "
          "emulated cluster with hosts) or spark (each rank a Spark barrier task on --master); "
          "the mapreduce strategy always runs on Spark", "local",
          rule=one_of("local", "spark")),
    Param("master", str, "Spark: the cluster's master URL (spark://HOST:PORT, yarn, "
          "k8s://..., local-cluster[N,CORES,MB])",
          derived="local-cluster[N,1,MB]: an executor of one core per rank (mapreduce: per "
          "worker) on this machine", metavar="URL",
          rule=Rule(lambda v, run: bool(str(v).strip()), lambda run: "be a master URL")),
    Param("executor_memory", int, "Spark: each executor's memory in MB", 1024,
          rule=at_least(MIN_EXECUTOR_MEMORY_MB, MAX_SPARK_MB)),
    Param("partitions", int, "mapreduce: partitions of the cached training set",
          derived="one per worker (executor)", rule=at_least(1, MAX_PARTITIONS)),
    Param("spark_conf", list, "Spark: settings of its own for the run, KEY=VALUE each (e.g. "
          "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1); they override "
          "polyrhythm's", [], item=str, metavar="KEY=VALUE",
          rule=Rule(lambda v, run: all("=" in x and x.split("=", 1)[0].strip() for x in v),
                    lambda run: "be KEY=VALUE settings")),
)

_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")
_LOCAL = re.compile(r"local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?$")


def master_of(config) -> str:
    """The run's Spark master: as given, or an executor of one core for each task the run
    needs on this machine."""
    if config.master:
        return config.master
    return f"local-cluster[{spark_tasks(config)},1,{config.executor_memory}]"


def spark_tasks(config) -> int:
    """The tasks a run keeps busy at once: a rank each, or mapreduce's workers."""
    return config.workers if runs_mapreduce(config) else config.world_size


def runs_mapreduce(config) -> bool:
    return config.strategy.name == "mapreduce"


def on_spark(config) -> bool:
    return config.launcher == "spark" or runs_mapreduce(config)


def task_slots(master: str, cores: int) -> int | None:
    """How many tasks `master` runs at once, where the URL says (local-cluster, local; `cores`:
    this machine's, for local[*]); None for a real cluster's master."""
    found = _LOCAL_CLUSTER.match(master.strip())
    if found:
        return int(found.group(1)) * int(found.group(2))
    found = _LOCAL.match(master.strip())
    if found:
        return cores if found.group(1) in (None, "*") else int(found.group(1))
    return None


def executor_memory_of(master: str, given: int) -> int:
    """An executor's memory: local-cluster's URL says it (its third number), else the
    setting."""
    found = _LOCAL_CLUSTER.match(master.strip())
    return int(found.group(3)) if found else given


def check_placeable(config, cores: int) -> None:
    """What Spark cannot give the run, as one line: an emulated cluster (Spark places tasks
    on its own executors), a run that goes on without a lost worker (a barrier stage ends
    every task when one fails), more tasks than the master has slots for (a barrier stage
    starts all its tasks at once, or waits for ever), executors below Spark's minimum."""
    if not on_spark(config):
        return
    master = master_of(config)
    where = "mapreduce" if runs_mapreduce(config) else "--launcher spark"
    if config.cluster.hosts:
        raise ConfigError(f"{where} runs on Spark's executors, which Spark places: it takes no "
                          "emulated hosts ([cluster] hosts, workers_per_host)")
    if runs_mapreduce(config):
        unread_by_mapreduce(config)
    if not runs_mapreduce(config) and config.on_worker_failure == "continue":
        raise ConfigError("--launcher spark cannot go on without a lost worker (a Spark "
                          "barrier stage ends every task when one fails): set "
                          "--on-worker-failure abort")
    need, slots = spark_tasks(config), task_slots(master, cores)
    if slots is not None and slots < need:
        what = (f"{config.workers} workers" if runs_mapreduce(config) else
                f"{config.world_size} ranks ({config.servers} servers + {config.workers} "
                "workers)")
        raise ConfigError(f"Spark master {master} runs {slots} tasks at once but {where} "
                          f"needs {need} at once for {what}")
    memory = executor_memory_of(master, config.executor_memory)
    if memory < MIN_EXECUTOR_MEMORY_MB:
        raise ConfigError(f"executors of {memory} MB are too small: Spark needs at least "
                          f"{MIN_EXECUTOR_MEMORY_MB} MB each (--executor-memory)")


def unread_by_mapreduce(config) -> None:
    """What mapreduce's Spark jobs do not do, as one line rather than silently ignored:
    emulated or slowed compute, compression, shared epochs."""
    given = {"compute": config.compute != "real", "slowdown": bool(config.slowdown),
             "worker_delay_s": bool(config.worker_delay_s),
             "compress": config.compression.name != "none",
             "shared_epochs": config.shared_epochs}
    for key, set_ in given.items():
        if set_:
            raise ConfigError(f"mapreduce takes no --{key.replace('_', '-')}: its Spark "
                              "tasks compute for real, uncompressed, each on its own "
                              "partition")


def check_spark_settings(config) -> None:
    """Spark's settings on a run that does not run on Spark (or partitions on one whose
    ranks are tasks), as one line rather than silently ignored."""
    given = [name for name in ("master", "partitions", "spark_conf") if getattr(config, name)]
    if not on_spark(config) and given:
        raise ConfigError(f"--{given[0].replace('_', '-')} is a Spark setting: add "
                          "--launcher spark (or --strategy mapreduce)")
    if on_spark(config) and not runs_mapreduce(config) and config.partitions:
        raise ConfigError("--partitions is mapreduce's: --launcher spark runs a task per rank")
