"""The mapreduce strategy: Spark MLlib's training on a real Spark (local-cluster: a driver JVM
and an executor JVM per worker, each with its Python workers). Full-batch gradient descent
reaches the least-squares solution; mini-batches take bsp's steps; nothing Spark started
outlives the run; bad input is one line before any run record."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import polyrhythm
from helpers import (
    HANG_GUARD_S,
    SPARK_CONF,
    equivalence_config,
    max_diff,
    reference_parameters,
    stored_parameters,
    whole_data,
)
from polyrhythm.cli import main
from polyrhythm.config.spark import check_placeable, check_spark_settings, task_slots
from polyrhythm.errors import ConfigError
from polyrhythm.launch.launchers.spark import partitions_fit, processes_of
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RunStore
from polyrhythm.runtime.mapreduce import DriverModel, ExecutorModel, Partition, Step, shares
from test_losses import write_table


def test_full_batch_gradient_descent_reaches_the_least_squares_solution(tmp_path):
    data = write_table(tmp_path / "table.csv", "mse", rows=400)
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data), loss="mse",
                                model="linear", strategy="mapreduce", workers=2,
                                spark_conf=SPARK_CONF, batch_size=360, epochs=10,
                                steps_per_epoch=1, lr=0.5, momentum=0.0,
                                weight_decay=0.0, lr_decay_every=0, warmup_steps=2)
    summary = polyrhythm.train(config)
    _, train, _ = whole_data(config)
    assert len(train) == 360  # so that one batch of 360 is the whole training set
    x, y = train.batch(slice(None))
    design = np.hstack([x.double().numpy(), np.ones((len(x), 1))])
    solution, *_ = np.linalg.lstsq(design, y.double().numpy(), rcond=None)
    trained = stored_parameters(summary).double().numpy()  # weight row, then bias
    assert np.linalg.norm(trained - solution) / np.linalg.norm(solution) <= 1e-3
    # The run is a run like any other: stored, completed, its mini-batches split in parts.
    row = RunStore(tmp_path / "runs" / STORE_NAME).run(summary["run_id"])
    assert row["status"] == "completed" and row["strategy"] == "mapreduce"
    parts = summary["mapreduce"]
    assert parts["steps_measured"] == 8 and parts["partitions"] == 2
    spans = ("schedule_s", "read_s", "broadcast_s", "compute_s", "aggregate_s", "update_s")
    assert all(parts[s] > 0 for s in spans), parts
    assert sum(parts[s] for s in spans) == pytest.approx(parts["step_s"], rel=1e-6)
    assert [w["steps"] for w in summary["per_worker"]] == [10, 10]
    # Its resource samples: each executor (JVM and Python workers) as a worker, the driver.
    sampled = {(r["role"], r["rank"]) for r in RunStore(
        tmp_path / "runs" / STORE_NAME).series("resources", summary["run_id"])}
    assert sampled == {("driver", -1), ("worker", 0), ("worker", 1)}
    # Nothing Spark started is left: no JVM, executor or Python worker (every one of them
    # carries the run's id in its environment).
    assert processes_of(summary["run_id"]) == []


def test_mini_batches_take_the_steps_bsp_takes(tmp_path):
    """Same global batch, data order and learning rate (momentum and a decay schedule
    too): after 20 steps the parameters agree with bsp's to 1e-5, and with the single-process
    reference."""
    data = write_table(tmp_path / "table.csv", "bce", rows=400)
    fields = dict(dataset="csv", data_path=str(data), loss="bce", model="linear", workers=2,
                  batch_size=32, epochs=2, steps_per_epoch=10, lr=0.2)
    # On local[2] (tasks in the driver's JVM; the other tests run local-cluster's executor
    # JVMs): the arithmetic is the same, at 9 s less CPU.
    mapreduce = polyrhythm.train(equivalence_config(tmp_path, strategy="mapreduce",
                                                    master="local[2]",
                                                    spark_conf=SPARK_CONF, **fields))
    bsp_config = equivalence_config(tmp_path, strategy="bsp", **fields)
    bsp = polyrhythm.train(bsp_config)
    assert max_diff(stored_parameters(mapreduce), stored_parameters(bsp)) <= 1e-5
    assert max_diff(stored_parameters(mapreduce), reference_parameters(bsp_config)) <= 1e-5
    assert mapreduce["final_val_accuracy"] == pytest.approx(bsp["final_val_accuracy"])
    assert processes_of(mapreduce["run_id"]) == []


def test_an_interrupted_run_leaves_no_process_and_is_stored_as_interrupted(tmp_path):
    """Ctrl-C once the run's Spark is up (its JVM started): every JVM and Python process of
    the run ends, and the run is stored as interrupted."""
    data = write_table(tmp_path / "table.csv", "mse", rows=400)
    out = tmp_path / "runs"
    run = subprocess.Popen([sys.executable, "-m", "polyrhythm.cli", "train", "--strategy",
                            "mapreduce", "--dataset", "csv", "--data-path", str(data), "--loss",
                            "mse", "--model", "linear", "--workers", "2", "--epochs", "500",
                            "--out", str(out), "--spark-conf", *SPARK_CONF],
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(p.name() == "java" for d in out.glob("2*") for p in processes_of(d.name)):
        assert run.poll() is None and time.monotonic() < deadline, "no JVM started"
        time.sleep(0.1)
    run.send_signal(signal.SIGINT)
    _, said = run.communicate(timeout=HANG_GUARD_S)
    assert run.returncode != 0 and "interrupted; all processes stopped" in said, said
    (row,) = RunStore(out / STORE_NAME).runs()
    assert row["status"] == "failed" and "interrupted" in row["error"]
    assert processes_of(row["run_id"]) == []


def test_partition_gradients_sum_to_the_global_batch_gradient(tmp_path):
    """Without Spark: each partition's weighted share, summed as the driver sums them, is the
    gradient of the mean loss over the whole global batch; a share larger than its partition
    is the whole partition (full batch)."""
    data = write_table(tmp_path / "table.csv", "mse", rows=100)
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data), loss="mse",
                                model="linear", strategy="mapreduce", workers=2)
    _, train, _ = whole_data(config)
    halves = [np.arange(0, 45), np.arange(45, 90)]
    parts = [Partition(i, train.x[h].numpy(), train.y[h].numpy(), 1, train.norm, False)
             for i, h in enumerate(halves)]
    assert shares(90, [45, 45]) == [45, 45] and shares(200, [45, 44]) == [45, 44]
    assert shares(33, [45, 45]) == [17, 16]
    driver = DriverModel(config, train.shape, 1)
    executor = ExecutorModel(config, train.shape, 1)
    step = Step(0, 0, 0, (45, 45))
    total = sum(executor.gradient(p, driver.weights(), step)[0] for p in parts)
    model = driver.model
    x, y = train.batch(torch.arange(90))
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert np.abs(total - expected.numpy()).max() <= 1e-5


def test_what_spark_cannot_run_is_one_line_before_any_record(tmp_path, capsys):
    data = write_table(tmp_path / "table.csv", "mse", rows=100)
    base = ["--dataset", "csv", "--data-path", str(data), "--loss", "mse", "--model", "linear",
            "--strategy", "mapreduce", "--out", str(tmp_path / "runs")]
    cases = {
        ("--master", "spark://127.0.0.1:9"): "Spark master spark://127.0.0.1:9 is "
                                             "unreachable",
        ("--executor-memory", "300"): "executor_memory must be at least 450",
        ("--workers", "3", "--master", "local-cluster[2,1,1024]"): "runs 2 tasks at once but "
                                                                   "mapreduce needs 3",
    }
    for flags, said in cases.items():
        code = main(["train", *base, *flags])
        err = capsys.readouterr().err
        assert code == 2, err
        assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("2*"))


def test_placement_and_memory_checks_without_spark(tmp_path):
    assert task_slots("local-cluster[3, 2, 1024]", 2) == 6
    assert task_slots("local[*]", 2) == 2 and task_slots("local", 8) == 8
    assert task_slots("local[4]", 2) == 4 and task_slots("spark://h:7077", 2) is None
    config = equivalence_config(tmp_path, strategy="mapreduce", workers=2)
    check_placeable(config, 2)
    with pytest.raises(ConfigError, match="takes no emulated hosts"):
        check_placeable(equivalence_config(tmp_path, strategy="mapreduce", workers=2,
                                           hosts=2), 2)
    for flags in ({"compress": "topk"}, {"slowdown": [1.0, 3.0]},
                  {"compute": "emulated", "compute_time": "10ms"}):
        with pytest.raises(ConfigError, match=f"mapreduce takes no --{next(iter(flags))}"):
            check_placeable(equivalence_config(tmp_path, strategy="mapreduce", workers=2,
                                               **flags), 2)
    # HIGGS on two executors of 1 GB: 10.5 M rows x 28 features do not fit their storage.
    with pytest.raises(ConfigError, match=r"caches 601 MB .* beyond its 434 MB"):
        partitions_fit(config, 10_500_000, 28)
    partitions_fit(config, 1_000_000, 90)  # YearPredictionMSD's width, a million rows: fits
    # Spark's settings where nothing runs on Spark, or mapreduce's where ranks are tasks.
    for fields, said in (({"master": "local[2]"}, "--master is a Spark setting"),
                         ({"spark_conf": ["a=b"]}, "--spark-conf is a Spark setting"),
                         ({"launcher": "spark", "partitions": 3}, "--partitions is mapreduce's")):
        with pytest.raises(ConfigError, match=said):
            check_spark_settings(equivalence_config(tmp_path, **fields))
