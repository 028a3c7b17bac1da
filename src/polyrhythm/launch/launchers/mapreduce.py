"""The `mapreduce` strategy on a Spark context, as MLlib trains (runtime/mapreduce.py holds
its arithmetic): the training set as a cached RDD of a partition per worker's shard, read by
the executors; then, for every mini-batch, the driver broadcasts the parameters and runs one
Spark job whose tasks read their cached partition, compute their share's gradient and are
tree-aggregated to the driver, which steps the optimizer.

Every mini-batch is timed in its parts, as the asynchronous-training thesis splits Spark's
time: scheduling and task start-up (the job submitted until the task ran), reading (the
task's cached partition fetched and deserialised, all of it whatever the batch), the
broadcast (made on the driver, fetched by the task), compute, aggregation (the last task's
end until the sum reached the driver) and the driver's update. Executors and driver share one
clock here (local-cluster); on a real cluster the parts that cross machines carry their
clocks' skew.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time

import numpy as np
import torch

from polyrhythm.data.datasets import open_source
from polyrhythm.data.plan import load_val, make_plan
from polyrhythm.data.sharding import steps_per_epoch
from polyrhythm.files import atomic_file
from polyrhythm.launch.launchers.spark_resources import SparkSampler
from polyrhythm.metrics.records import RunRecord, complete_run
from polyrhythm.runtime.mapreduce import (
    DriverModel,
    ExecutorModel,
    Step,
    read_partition,
    run_result,
    shares,
)

TREE_DEPTH = 2  # MLlib's treeAggregate depth for gradients
PARTS = ("schedule", "read", "broadcast", "compute", "aggregate", "update")


def train_mapreduce(context, config, record: RunRecord) -> dict:
    """Train the run on `context`; complete its record and return the summary."""
    started = time.perf_counter()
    source = open_source(config.data, config.seed)
    count = config.partitions or config.workers
    plan = make_plan(source, config.data, count, config.seed, config.loss)
    val = load_val(source, plan)
    driver = DriverModel(config, plan.shape, plan.classes)
    cached, loading = cache_partitions(context, config, plan)
    sizes = [len(s) for s in plan.shards]
    steps = steps_per_epoch(len(plan.train), config.batch_size, config.steps_per_epoch)
    step_shares = tuple(shares(config.batch_size, sizes))
    job = MiniBatchJob(context, cached, config, plan.shape, plan.classes)
    parts: list[dict] = []
    partitions = [{"index": i, "batch_size": step_shares[i], "epochs": [], "iterations": [],
                   "traffic": {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0,
                               "messages_received": 0, "native_collective_bytes": 0}}
                  for i in range(count)]
    sampler = SparkSampler(record.run_id, started,
                           lambda rank: _moved(partitions, config.workers, rank))
    with sampler if config.instrumentation else contextlib.nullcontext():
        _train(job, driver, partitions, parts, val, config, steps, step_shares, started)
    figures = mapreduce_figures(parts, config.warmup_steps, loading, count, sizes)
    result = run_result(config, driver, val, partitions, time.perf_counter() - started,
                        figures)
    result.summary["data"] = plan.summary()
    result.series["resources"] = sampler.samples
    with atomic_file(record.model_path) as file:  # a full disk leaves no half a model
        torch.save(result.state_dict, file)
    return complete_run(record, result.summary, result.epochs, result.series)


def _train(job, driver, partitions, parts, val, config, steps, step_shares, started) -> None:
    taken = 0
    for epoch in range(config.epochs):
        epoch_began, losses = time.perf_counter(), []
        for step in range(steps):
            timed = job.run(driver, Step(epoch, step, taken, step_shares),
                            started=started)
            taken += 1
            losses.append(timed["loss"])
            parts.append(timed)
            for p in partitions:
                p["iterations"].append(timed["rows"][p["index"]])
                _count_traffic(p["traffic"], len(driver.flat))
        _end_epoch(partitions, driver, val, epoch, epoch_began, started, losses, config)
        progress(epoch, config.epochs, losses, parts)


def _moved(partitions: list[dict], executors: int, rank: int) -> tuple[int, int]:
    """The bytes executor `rank` has moved so far: its share of every task's (the driver's,
    rank -1: all of them, the other way)."""
    sent = sum(p["traffic"]["bytes_sent"] for p in partitions)
    received = sum(p["traffic"]["bytes_received"] for p in partitions)
    return (received, sent) if rank < 0 else (sent // executors, received // executors)


def cache_partitions(context, config, plan) -> tuple:
    """The training set as a cached RDD of one partition per shard, each read by the executor
    that keeps it; (the RDD, what reading it took: its rows, and seconds from the job's
    submission to the last partition cached, and the slowest partition's own reading)."""
    values = config.to_dict()
    shards = [(i, plan.train[s], plan.train_labels[s]) for i, s in enumerate(plan.shards)]

    def read(element):
        began = time.perf_counter()
        partition = read_partition(values, *element)
        partition.read_s = time.perf_counter() - began
        return partition

    cached = context.parallelize(shards, len(shards)).map(read).cache()
    began = time.perf_counter()
    read = cached.map(lambda p: (len(p.y), p.read_s)).collect()  # reads and caches
    loading = {"rows": sum(n for n, _ in read), "seconds": time.perf_counter() - began,
               "slowest_s": max(s for _, s in read)}
    return cached, loading


class MiniBatchJob:
    """One Spark job per mini-batch over the cached partitions, timed in its parts."""

    def __init__(self, context, cached, config, shape, classes) -> None:
        self.context, self.cached = context, cached
        self.values, self.toml = config.to_dict(), config.to_toml()
        self.shape, self.classes = tuple(shape), classes

    def run(self, driver: DriverModel, step: Step, started: float) -> dict:
        """Broadcast the parameters, run the job, step the driver's model; the step's loss,
        its parts and its iteration row per partition (the store's columns)."""
        began = time.time()
        broadcast = self.context.broadcast(driver.weights())
        submitted = time.time()
        task = partition_task(broadcast, step, self.values, self.toml, self.shape,
                              self.classes)
        gradient, loss, tasks = self.cached.mapPartitions(task).treeAggregate(
            (None, 0.0, []), _add, _add, depth=TREE_DEPTH)
        aggregated = time.time()
        broadcast.destroy(blocking=False)
        driver.step(gradient, loss, step.epoch, step.step)
        ended = time.time()
        last = max(t["ended"] for t in tasks)
        rows = {}
        for t in tasks:
            # The store's spans: compute, push (aggregation), wait (scheduling and start-up,
            # then the slowest task), pull (the broadcast), apply (the update), compress, read.
            rows[t["index"]] = (
                t["index"], step.taken, step.epoch, began - _wall(started),
                t["computed"], aggregated - last,
                (t["began"] - submitted) + (last - t["ended"]),
                (submitted - began) + t["fetched"], ended - aggregated, 0.0, t["read"],
                ended - began)
        # The step's parts along its critical path: the task that ended last.
        critical = next(t for t in tasks if t["ended"] == last)
        return {"loss": loss, "rows": rows, "tasks": tasks,
                "schedule": critical["began"] - submitted, "read": critical["read"],
                "broadcast": (submitted - began) + critical["fetched"],
                "compute": critical["computed"], "aggregate": aggregated - last,
                "update": ended - aggregated, "step": ended - began,
                # Tasks read at once: their rows per second add up.
                "read_rate": sum(t["rows"] / t["read"] for t in tasks if t["read"] > 0)}


def partition_task(broadcast, step: Step, values: dict, toml: str, shape, classes):
    """The function each task of a mini-batch job runs on its partition (in an executor's
    Python worker): it reads the cached partition, fetches the parameters, computes."""

    def task(iterator):
        began, cpu = time.time(), time.process_time()
        partitions = list(iterator)  # the cached partition, fetched and deserialised
        read = time.time()
        weights = broadcast.value
        fetched = time.time()
        model = ExecutorModel.of(toml, values, shape, classes)
        for partition in partitions:
            gradient, loss, gathered = model.gradient(partition, weights, step)
            ended = time.time()
            # Reading: the partition fetched and deserialised, then the batch's rows
            # gathered from it (a bsp worker's read span is the gathering alone).
            yield (gradient, loss, [{
                "index": partition.index, "began": began, "read": read - began + gathered,
                "fetched": fetched - read, "computed": ended - fetched - gathered,
                "ended": ended,
                "cpu_s": time.process_time() - cpu, "rows": len(partition.y),
                "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}])

    return task


def _add(a: tuple, b: tuple) -> tuple:
    """Partial sums of (gradient, loss, task timings); a gradient of None is zero."""
    gradient = b[0] if a[0] is None else a[0] if b[0] is None else a[0] + b[0]
    return gradient, a[1] + b[1], a[2] + b[2]


def _wall(started: float) -> float:
    """The wall-clock time of perf_counter's `started`."""
    return time.time() - (time.perf_counter() - started)


def _count_traffic(traffic: dict, words: int) -> None:
    """The bytes a partition's task moves per mini-batch: the parameters in (the broadcast)
    and its gradient out (the aggregation); Spark's own framing is not counted."""
    traffic["bytes_received"] += 4 * words
    traffic["bytes_sent"] += 4 * words
    traffic["messages_received"] += 1
    traffic["messages_sent"] += 1


def _end_epoch(partitions: list[dict], driver: DriverModel, val, epoch: int,
               epoch_began: float, started: float, losses: list[float], config) -> None:
    """Each partition's record of the epoch (as a worker's), the first with the
    validation of the driver's model."""
    now = time.perf_counter()
    seconds = now - epoch_began
    for p in partitions:
        rows = p["iterations"][-len(losses):] if losses else []
        measured = [r for r in rows if r[1] >= config.warmup_steps]  # r[1]: steps before
        record = {"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else np.nan,
                  "samples": len(losses) * p["batch_size"], "seconds": seconds,
                  "wall_s": now - started,
                  "measured_samples": len(measured) * p["batch_size"],
                  "measured_seconds": sum(r[-1] for r in measured)}
        if p["index"] == 0:
            record |= driver.validate(val)
        p["epochs"].append(record)


def mapreduce_figures(parts: list[dict], warmup: int, loading: dict, count: int,
                      sizes: list[int]) -> dict:
    """What mapreduce adds to the summary: per mini-batch (after the warm-up steps), the mean
    seconds of each part; the executors' reading (rows per second of reading time, every
    partition read whole for each mini-batch); the tasks' CPU and memory; the first read."""
    kept = parts[warmup:] or parts
    tasks = [t for p in kept for t in p["tasks"]]

    def mean(values) -> float:
        values = list(values)
        return float(np.mean(values)) if values else 0.0

    return {
        "partitions": count, "steps_measured": len(kept),
        # Seconds per mini-batch, along the path of the task that ended last: they add up
        # to the step.
        **{f"{part}_s": mean(p[part] for p in kept) for part in PARTS},
        "step_s": mean(p["step"] for p in kept),
        # Every task reads its whole partition, whatever its share of the batch.
        "read_examples_per_s": mean(p["read_rate"] for p in kept),
        "rows_read_per_step": sum(sizes),
        "task_cpu_s": mean(t["cpu_s"] for t in tasks),
        "task_rss_bytes": max((t["rss_bytes"] for t in tasks), default=0),
        "load_rows": loading["rows"], "load_s": loading["seconds"],
        "load_slowest_s": loading["slowest_s"],
        "load_examples_per_s": loading["rows"] / loading["seconds"],
    }


def progress(epoch: int, epochs: int, losses: list[float], parts: list[dict]) -> None:
    """One line an epoch on the driver's output (the launcher's log)."""
    step_ms = 1000 * float(np.mean([p["step"] for p in parts[-len(losses):]])) if losses else 0
    print(f"[mapreduce] epoch {epoch + 1}/{epochs} loss {np.mean(losses):.4f} "
          f"{step_ms:.1f} ms a mini-batch", file=sys.stderr, flush=True)
