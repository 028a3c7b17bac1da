"""What a run can honour: every numeric setting has a range its consumers take (limits.py),
a value beyond it is one line before anything is recorded, and the bound itself goes through
what consumes it (a Gloo timeout, a wait, a step on float32 weights, a QSGD code, a cgroup
quota). The data-dependent checks (a validation share, a batch, class ids) and a resume's
epochs are refused before the run's record is touched."""

from __future__ import annotations

import math
import socket
import threading
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

import polyrhythm.api
from polyrhythm.cli import main
from polyrhythm.comm.waiting import NEVER
from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression.wire import Extent
from polyrhythm.config import CLUSTER, COMPONENTS, GENERAL, OPTIMIZER, RunConfig, make_config
from polyrhythm.data.plan import hold_out
from polyrhythm.errors import ConfigError
from polyrhythm.launch.cluster.cgroups import quota_files
from polyrhythm.launch.launchers import registry as launchers
from polyrhythm.limits import (
    MAX_CLASSES,
    MAX_CPU,
    MAX_DELAY_S,
    MAX_FACTOR,
    MAX_QSGD_LEVELS,
    MAX_SLOWDOWN,
    MAX_TIMEOUT_S,
    MIN_CPU,
    MIN_TIMEOUT_S,
)
from polyrhythm.losses import LOSSES
from polyrhythm.metrics.records import RunRecord
from polyrhythm.metrics.store import process_identity
from polyrhythm.optim import FlatSGD
from polyrhythm.runtime.checkpoint import epoch_dir
from polyrhythm.settings import Param, Settings

# --- one line for each value a run cannot honour (each accepted before, to fail after) ---------

class Recorded(Exception):
    """Raised where a run would be recorded (start_run) or launched: past the checks."""


def _recorded(*args, **kwargs):
    raise Recorded


CLUSTER_RUN = {"hosts": 2, "workers": 2, "strategy": "allreduce"}


@pytest.mark.parametrize("values, needle", [
    # Gloo's clock: 9e9 s spun both ranks in the rendezvous, 1e10 failed it at once
    ({"timeout": 9e9}, "timeout must be in [0.001, 2592000], got 9000000000.0"),
    ({"timeout": 1e10}, "timeout must be in [0.001, 2592000]"),
    ({"timeout": 1e-4}, "timeout must be in [0.001, 2592000]"),  # 0 ms to Gloo
    ({"timeout": math.inf}, "timeout must be a finite number, got inf"),
    # time.sleep's OverflowError in a rank
    ({"workers": 2, "worker_delay_s": [0, math.inf]}, "worker_delay_s must be a finite number"),
    ({"workers": 2, "worker_delay_s": [0, 1e10], "timeout": 1e6},
     "worker_delay_s must have entries of at least 0 (and at most 86400)"),
    ({"compute": "emulated", "compute_time": "10000000000s"},
     "compute_time must be a duration such as 120ms, at most a day (86400s)"),
    ({"compute": "emulated", "compute_time": "1ms", "compute_jitter": "9" * 20 + "ms"},
     "compute_jitter must be a duration"),
    ({"latency": "100000s"}, "latency must be a duration such as 120ms, at most a day"),
    ({"workers": 2, "slowdown": [1, 1e300]},
     "slowdown must have entries of at least 1 (and at most 1000)"),
    # float32 weights: torch refuses a step factor beyond 3.4e38
    ({"lr": 1e39}, "lr must be positive (and at most 1000000), got 1e+39"),
    ({"lr": 1e300}, "lr must be positive (and at most 1000000)"),
    ({"optimizer": "adam", "eps": 1e39}, "eps must be positive (and at most 1000000)"),
    ({"weight_decay": 1e39}, "weight_decay must be at least 0 (and at most 1000000)"),
    ({"lr_decay": 10.0}, "lr_decay must be in (0, 1], got 10.0"),
    ({"lr_decay": -1.0}, "lr_decay must be in (0, 1]"),  # a negative lr: Adam refuses it
    ({"lr_decay": math.inf}, "lr_decay must be a finite number"),
    # counts beyond reason
    ({"threads": 100_000}, "threads must be at least 1 (and at most 1024), got 100000"),
    ({"strategy": "asp", "servers": 10**6}, "servers must be at least 0 (and at most 65536)"),
    ({"strategy": "downpour", "push_every": 2**40}, "push_every must be at least 1 (and at most "
                                                    "1000)"),
    ({"compress": "qsgd", "levels": 2**30}, "levels must be at least 1 (and at most 1073741823)"),
    ({**CLUSTER_RUN, "cpu": 1e308}, "cpu must have entries from 0.01 to 1024"),
    ({**CLUSTER_RUN, "cpu": 0.001}, "cpu must have entries from 0.01 to 1024"),
    ({**CLUSTER_RUN, "bandwidth": "1tbit"}, "bandwidth must have entries such as 100mbit or "
                                            "1gbit, from 8kbit to 100gbit"),
    ({**CLUSTER_RUN, "bandwidth": "500bit"}, "from 8kbit to 100gbit"),
    ({"dataset": "synthetic", "synthetic_classes": 2**40, "synthetic_size": 2**41},
     "synthetic_classes must be at least 2 (and at most 1048576)"),
    ({"dataset": "synthetic", "synthetic_size": 2**40},
     "synthetic_size x the synthetic_shape's values is 70,368,744,177,664 values, beyond the "
     "1,073,741,824"),
    ({"dataset": "table", "table_rows": 2**40}, "table_rows x 28 features"),
    ({"launcher": "spark", "executor_memory": 2**40},
     "executor_memory must be at least 450 (and at most 2147483647)"),
    ({"strategy": "mapreduce", "partitions": 2**40},
     "partitions must be at least 1 (and at most 65536)"),
])
def test_values_a_run_cannot_honour_are_one_line_errors(values: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig(**values)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and needle in message, message


@pytest.mark.parametrize("values, needle", [
    ({"workers": 2, "worker_delay_s": [0, 300]}, "worker_delay_s 300s is not below timeout "
                                                 "300s"),
    ({"latency": "400s"}, "latency 400s is not below timeout 300s"),
    ({"compute": "emulated", "compute_time": "50s", "workers": 2, "worker_delay_s": [0, 30],
      "latency": "25s", "timeout": 100},
     "compute_time 50s + worker_delay_s 30s + latency 25s is not below timeout 100s"),
])
def test_emulated_waits_at_or_past_the_timeout_are_refused(values: dict, needle: str) -> None:
    """A peer waits at most the timeout for a message: a step or a message set to take
    longer fails every run, naming a peer that did as it was told."""
    with pytest.raises(ConfigError, match="raise --timeout") as info:
        RunConfig(**values)
    assert needle in str(info.value)
    RunConfig(**{**values, "timeout": 1000})  # with a longer timeout: accepted


@pytest.mark.parametrize("flags, needle", [
    (["--timeout", "9e9"], "timeout must be in [0.001, 2592000]"),
    (["--threads", "100000"], "threads must be at least 1 (and at most 1024)"),
    (["--lr", "1e39"], "lr must be positive (and at most 1000000)"),
    (["--workers", "2", "--worker-delay-s", "0", "inf"], "worker_delay_s must be a finite"),
])
def test_the_flags_stop_at_one_line_before_a_run_is_recorded(monkeypatch, tmp_path, capsys,
                                                           flags, needle) -> None:
    monkeypatch.setattr(polyrhythm.api, "train", _recorded)  # accepted: no run starts
    out = tmp_path / "runs"
    try:
        code = main(["train", *flags, "--out", str(out)])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()


# --- the data's own limits, before the run is recorded -----------------------------------------

def huge_label(seed):
    """A user's data set whose last label is 2**40: a model of 2**40 + 1 outputs."""
    y = np.arange(40) % 4
    y[-1] = 2**40
    return np.random.default_rng(seed).normal(size=(40, 3)).astype(np.float32), y


@pytest.mark.parametrize("values, needle", [
    ({"dataset": "digits", "val_fraction": 0.9999},
     "dataset digits has 1,797 examples and val_fraction 0.9999 holds out 1,797 of them, "
     "leaving none to train on"),
    ({"dataset": "digits", "batch_size": 2**40},
     "batch_size 1,099,511,627,776 is more than the 1,617 training examples of dataset digits"),
    ({"dataset": "digits", "workers": 2, "batch_size": 1618}, "more than the 1,617 training"),
    ({"dataset": "test_limits:huge_label", "model": "mlp"},
     "loss cross_entropy needs class ids 0, 1, 2, ... below 1,048,576 (--loss mse for "
     "real-valued targets); example 40 has target 1099511627776"),
])
def test_data_a_run_cannot_take_is_refused_before_it_is_recorded(monkeypatch, tmp_path,
                                                                values, needle) -> None:
    monkeypatch.setattr(polyrhythm.api, "start_run", _recorded)
    with pytest.raises(ConfigError) as info:
        polyrhythm.api.train({**values, "out": str(tmp_path)})
    assert needle in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_whole_training_set_in_one_batch_is_accepted(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(polyrhythm.api, "start_run", _recorded)
    with pytest.raises(Recorded):
        polyrhythm.api.train({"dataset": "digits", "batch_size": 1617, "out": str(tmp_path)})


def test_real_valued_class_ids_beyond_the_limit_are_refused() -> None:
    """A CSV's targets are floats: a whole number of 2**40 passed as a class id."""
    loss = LOSSES["cross_entropy"]
    assert loss.targets(np.array([0.0, MAX_CLASSES - 1.0]), MAX_CLASSES, "d").dtype == np.int64
    with pytest.raises(ConfigError, match="example 3 has target 1099511627776$"):
        loss.targets(np.array([0.0, 1.0, 2.0**40]), 2**40 + 1, "dataset csv")


def test_a_split_that_leaves_nothing_to_train_on_is_an_error_wherever_it_is_made() -> None:
    assert [len(part) for part in hold_out(10, 0, 0.9, seed=0)] == [1, 9]
    with pytest.raises(ConfigError, match="10 examples and val_fraction 0.99 holds out 10 of"):
        hold_out(10, 0, 0.99, seed=0)
    with pytest.raises(ConfigError, match="its validation part is all 5 of them"):
        hold_out(5, 5, 0.1, seed=0)


# --- a resume's epochs -------------------------------------------------------------------------

def test_resuming_to_fewer_epochs_than_done_is_refused_and_the_run_left_as_it_was(
        monkeypatch, tmp_path) -> None:
    """--resume --epochs 1 after 2 epochs: the run cannot end before the epochs it has done
    (it stored --epochs 1 beside 2 epochs' rows); as many as done is accepted."""
    out = tmp_path / "runs"
    config = make_config({"strategy": "allreduce", "workers": 2, "dataset": "digits",
                          "epochs": 4, "out": str(out)})
    record = RunRecord(out, "20260101-000000-allreduce-gone00")
    (record.dir / "logs").mkdir(parents=True)
    (record.dir / "config.toml").write_text(config.to_toml())
    record.store.add_run(record.run_id, "2026-01-01T00:00:00+00:00", config.columns(),
                         config.to_toml(), launcher={**process_identity(), "start": "0"})
    for worker in (0, 1):  # a complete checkpoint after epoch 2
        path = epoch_dir(record.dir, 2) / f"worker-{worker}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({}, path)
    monkeypatch.setattr(launchers, "launch_local", _recorded)  # the local launcher's start
    with pytest.raises(ConfigError, match=f"^run {record.run_id} has done 2 epochs: --epochs 1 "
                                          "would end it before them; give at least 2$"):
        polyrhythm.api.resume(record.run_id, out, say=lambda line: None, epochs=1)
    row = record.store.run(record.run_id)
    assert row["status"] == "failed" and row["epochs"] == 4
    with pytest.raises(Recorded):
        polyrhythm.api.resume(record.run_id, out, say=lambda line: None, epochs=2)


# --- each bound goes through what consumes it --------------------------------------------------

def test_the_longest_timeout_is_one_gloo_keeps() -> None:
    """A process group with the longest timeout meets and reduces (1e10 s fails at once:
    Gloo's nanoseconds overflow), and it stays below the 365 days of the waits that keep
    their own time."""
    assert timedelta(seconds=MAX_TIMEOUT_S) < NEVER
    assert timedelta(seconds=MIN_TIMEOUT_S) >= timedelta(milliseconds=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=timedelta(seconds=MAX_TIMEOUT_S))
    try:
        x = torch.ones(3)
        dist.all_reduce(x)
        assert x.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_the_longest_waits_are_ones_python_takes() -> None:
    """time.sleep and every timed wait overflow past threading.TIMEOUT_MAX (9.2e9 s): the
    longest delay, a slowdown of the longest step and every emulated wait at once stay far
    below, and a timed wait takes them."""
    longest = 2 * MAX_DELAY_S + MAX_DELAY_S + MAX_SLOWDOWN * MAX_DELAY_S + MAX_TIMEOUT_S
    assert longest < threading.TIMEOUT_MAX / 100
    assert threading.Lock().acquire(timeout=longest)  # free: returns at once, overflows not


def test_the_largest_step_factors_go_through_float32_weights() -> None:
    """lr, weight decay and eps at their largest step float32 weights (SGD, and Adam whose
    first step divides lr by 1 - beta1, at its smallest); torch refuses 1e39."""
    weights = torch.zeros(4)
    options = Settings({"momentum": 0.9, "async_momentum_correction": False,
                        "weight_decay": MAX_FACTOR})
    FlatSGD(weights, options).step(torch.ones(4), MAX_FACTOR)
    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.ones(4)
    torch.optim.Adam([param], lr=MAX_FACTOR, betas=(1 - 2**-53, 0.999), eps=MAX_FACTOR,
                     weight_decay=MAX_FACTOR).step()
    assert torch.isfinite(weights).all() and torch.isfinite(param).all()
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(4).add_(torch.ones(4), alpha=1e39)


def test_qsgd_at_its_most_levels_decodes_what_it_encoded() -> None:
    values = torch.randn(1000, generator=torch.Generator().manual_seed(0))

    def error(levels: int) -> float:
        settings = Settings({"levels": levels})
        codec = COMPRESSORS["qsgd"].build(settings, Extent(1000), 0)
        out = torch.empty(codec.words)
        codec.encode(values, out)
        return (codec.decode(out, torch.empty(1000)) - values).abs().max().item()

    assert error(MAX_QSGD_LEVELS) < 1e-4
    assert error(MAX_QSGD_LEVELS + 1) > 1  # the sign on int32's own bit


def test_a_hosts_cpu_share_is_a_quota_the_kernel_takes() -> None:
    """The least share is the kernel's least quota (1 ms a 100 ms period), not rounded up
    to it; the most an integer quota."""
    assert quota_files(2, MIN_CPU) == {"cpu.max": "1000 100000"}
    assert quota_files(2, MAX_CPU) == {"cpu.max": f"{int(MAX_CPU * 100_000)} 100000"}


def test_class_ids_up_to_the_limit_are_taken() -> None:
    labels = np.array([0, MAX_CLASSES - 1])
    assert (LOSSES["cross_entropy"].targets(labels, MAX_CLASSES, "d") == labels).all()
    with pytest.raises(ConfigError, match=f"example 2 has target {MAX_CLASSES}$"):
        LOSSES["cross_entropy"].targets(np.array([0, MAX_CLASSES]), MAX_CLASSES + 1, "d")


# Numeric settings without an upper bound of their own, and why none is needed: whatever value
# a config holds (at most 64 bits), what reads it takes it.
UNBOUNDED = {
    "batch_size": "at most the training examples: checked against the data before a run",
    "worker_batch_size": "sets batch_size, checked as that is",
    "epochs": "a loop's count; a long run is the user's to ask for",
    "seed": "numpy and torch take any seed of 64 bits",
    "steps_per_epoch": "a cap: min(steps, cap)",
    "warmup_steps": "compared with a step count",
    "checkpoint_every": "a modulo of the epochs done",
    "bucket_kb": "a bucket larger than the model is the model",
    "lr_decay_every": "the exponent of an lr_decay of at most 1",
    "hosts": "at most the workers and servers (emulation.settle)",
    "workers_per_host": "rounded up to one host",
    "staleness": "compared with clocks",
    "quorum": "at most the workers",
    "min_workers": "at most the workers (config/servers.py check_min_workers)",
    "dies_after_steps": "each compared with a worker's step count",
    "backup": "below the workers",
    "tau": "a modulo of the steps",
    "window": "a count of validation losses to wait for",
    "value_bound": "compared with a max-norm",
    "loss_threshold": "compared with a percentage",
    "components": "at most the samples and features (min)",
    "clusters": "at most the samples (min)",
    "max_iter": "KMeans stops when it converges",
    "max_rows": "a cap on the rows read",
    "synthetic_size": "with synthetic_shape, at most MAX_GENERATED_VALUES (its check)",
    "synthetic_shape": "with synthetic_size, at most MAX_GENERATED_VALUES (its check)",
    "table_rows": "with its features, at most MAX_GENERATED_VALUES (its check)",
    "rank": "at most each matrix's smaller side (min)",
}
DURATIONS_AND_RATES = {"compute_time", "compute_jitter", "latency", "latency_jitter",
                       "bandwidth"}


def declared() -> list[Param]:
    own = [p for kind in COMPONENTS.values() for c in kind.registry.values()
           for p in (*kind.shared, *c.params)]
    return [*GENERAL, *OPTIMIZER, *CLUSTER, *own]


def test_every_numeric_setting_has_a_bound_or_a_reason_it_needs_none() -> None:
    numeric = {p.name: p for p in declared()
               if p.kind in (int, float) or p.item in (int, float) or p.name in
               DURATIONS_AND_RATES}
    unbounded = {name for name, p in numeric.items() if p.rule is None or p.rule.most is None}
    assert unbounded == set(UNBOUNDED), unbounded ^ set(UNBOUNDED)
    for name, p in numeric.items():
        most = p.rule.most if p.rule is not None else None
        assert most is None or math.isfinite(most), name


def test_the_bounds_are_the_limits_declared() -> None:
    """Each setting accepts its bound exactly and refuses just past it."""
    for values in ({"timeout": MAX_TIMEOUT_S}, {"timeout": MIN_TIMEOUT_S},
                   {"lr": MAX_FACTOR}, {"threads": 1024}, {"latency": "86400s",
                                                           "timeout": MAX_TIMEOUT_S}):
        RunConfig(**values)
    for values in ({"timeout": MAX_TIMEOUT_S * 1.000001}, {"lr": MAX_FACTOR * 1.000001},
                   {"threads": 1025}, {"latency": "86400.001s"}):
        with pytest.raises(ConfigError):
            RunConfig(**values)
