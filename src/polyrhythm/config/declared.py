"""The settings every run has: the general ones (workers, epochs, ...), the emulated compute,
and the optimizer's. Components (strategies, data sets, models) declare their own."""

from __future__ import annotations

import os
from collections.abc import Mapping

from polyrhythm.config.emulation import COMPUTE
from polyrhythm.config.spark import SPARK
from polyrhythm.errors import ConfigError
from polyrhythm.limits import (
    MAX_DELAY_S,
    MAX_FACTOR,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MIN_TIMEOUT_S,
)
from polyrhythm.settings import Param, Rule, at_least, each, number, one_of, positive, within


def default_workers() -> int:
    """CPU cores, capped at 4: more workers than cores only slows real compute down."""
    return max(1, min(os.cpu_count() or 1, 4))


# The losses a run may train with (losses.py implements them; a test checks the names agree).
LOSS_NAMES = ("cross_entropy", "mse", "bce")

DEFAULT_BUCKET_KB = 25600  # 25 MiB, as DDP's default bucket: one bucket for small models

# Each numeric setting's range is what a run can honour; limits.py says why each bound.
GENERAL = (
    Param("workers", int, "number of workers N", derive=lambda run: default_workers(),
          derived="CPU cores, at most 4", rule=at_least(1, MAX_WORKERS)),
    Param("servers", int, "parameter-server shards", derived="1 for PS strategies, 0 "
          "otherwise", rule=at_least(0, MAX_WORKERS)),
    Param("bucket_kb", int, "PS strategies: gradients and parameters travel in buckets of "
          "about this many KiB (whole-gradient strategies: one bucket)",
          derived=f"{DEFAULT_BUCKET_KB} (25 MiB)", rule=at_least(1)),
    Param("epochs", int, "passes over the training set", 3, rule=at_least(1)),
    Param("shared_epochs", bool, "parameter-server strategies: an epoch is its global "
          "batches, taken by whichever workers are ready, so faster workers take more (as "
          "TensorFlow's parameter-server coordinator hands out steps); off: each worker takes "
          "each epoch's steps from its own shard", False),
    Param("batch_size", int, "global batch B; each worker takes B/N", 64),
    Param("worker_batch_size", int, "batch per worker b: sets batch_size to b x workers, so "
          "a sweep over workers keeps each worker's batch (weak scaling)", rule=at_least(1)),
    Param("seed", int, "fixes initial weights, the validation split, sharding and data order",
          0, rule=at_least(0)),
    Param("loss", str, "what the model is trained on: cross_entropy (classes 0..C-1, a logit "
          "per class), mse (real-valued targets, one output) or bce (classes 0 and 1, one "
          "logit); validation reports accuracy for cross_entropy and bce",
          "cross_entropy", rule=one_of(*LOSS_NAMES)),
    Param("steps_per_epoch", int, "cap on steps per epoch", derived="all", rule=at_least(1)),
    Param("worker_delay_s", list, "extra seconds of emulated compute per step, one entry per "
          "worker", [], item=float, rule=each(lambda v: 0 <= v <= MAX_DELAY_S, "of at least 0 "
                                              f"(and at most {number(MAX_DELAY_S)})",
                                              MAX_DELAY_S)),
    Param("threads", int, "torch threads per worker (servers use 1)",
          derived="cores / workers on the host", rule=at_least(1, MAX_THREADS)),
    Param("warmup_steps", int, "first steps of each worker left out of throughput figures", 5,
          rule=at_least(0)),
    Param("instrumentation", bool, "record every iteration's spans, server events and ~1 Hz "
          "resource samples in the store (off: totals only)", True),
    Param("out", str, "directory that holds run records and the store", "runs", metavar="DIR"),
    Param("shared_perms", bool, "let the run's files (model, checkpoints, logs) and a new "
          "store follow the umask, readable by others as it allows; off: the run's folder is "
          "its owner's alone (0700), a new store and its folder too", False),
    Param("checkpoint_every", int, "write a checkpoint every this many epochs, and at the "
          "end (0: never); `polyrhythm train --resume RUN_ID` (a script's: `polyrhythm run "
          "--resume RUN_ID`) goes on from the last", 1,
          rule=at_least(0)),
    Param("timeout", float, "seconds any process waits for a peer (a message, a collective) "
          "before the run fails naming the silent peer", 300.0,
          rule=within(MIN_TIMEOUT_S, MAX_TIMEOUT_S)),
    Param("on_worker_failure", str, "when a worker dies: continue (parameter-server "
          "strategies: the servers carry on with the other workers; collective ones: the "
          "workers left sum over themselves; the loss recorded) or abort (every process "
          "stops; --resume goes on from the last checkpoint)",
          derived="continue for asynchronous PS strategies and quorums the other workers "
          "still meet, abort otherwise", rule=one_of("continue", "abort")),
    Param("min_workers", int, "with on_worker_failure = continue: the fewest workers the run "
          "goes on with; a loss that would leave fewer fails the run, naming the worker lost",
          1, rule=at_least(1)),
    *COMPUTE,
    *SPARK,
)

# The optimizers a run may name (optim.py: sgd is FlatSGD, the others torch.optim's classes),
# and the settings only some of them read.
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")
# (momentum and async_momentum_correction are SGD's too, but have defaults a stored config
# holds whatever the optimizer: the others ignore them.)
READ_BY = {"betas": ("adam", "adamw"), "eps": ("adam", "adamw", "rmsprop", "adagrad")}

OPTIMIZER = (
    Param("optimizer", str, "what every server and worker steps: sgd (momentum, weight "
          "decay) or torch.optim's adam, adamw, rmsprop, adagrad, on its slice of the model",
          derived="sgd", rule=one_of(*OPTIMIZERS)),
    Param("lr", float, "learning rate", 0.05, rule=positive(MAX_FACTOR)),
    Param("momentum", float, "SGD momentum", 0.9, rule=within(0, 1, high_open=True)),
    Param("async_momentum_correction", bool, "asynchronous servers subtract the momentum "
          "asynchrony implies", True),
    Param("betas", list, "adam, adamw: the decay rates of the gradient's running mean and "
          "square (beta1, beta2)", derived="0.9, 0.999", item=float,
          rule=Rule(lambda v, run: len(v) == 2 and all(0 <= b < 1 for b in v),
                    lambda run: "be two numbers in [0, 1)", 1.0)),
    Param("eps", float, "adam, adamw, rmsprop, adagrad: added to the denominator",
          derived="torch's: 1e-8, 1e-10 for adagrad", rule=positive(MAX_FACTOR)),
    Param("weight_decay", float, "L2 weight decay", 1e-4, rule=at_least(0, MAX_FACTOR)),
    Param("lr_decay_every", int, "multiply lr by lr_decay every this many epochs (0: never)",
          0, rule=at_least(0)),
    # A decay: above 1 the rate would grow past what a step can take (MAX_FACTOR), at 0 or
    # below it would stop training or climb the loss (torch's Adam refuses a negative lr).
    Param("lr_decay", float, "step learning-rate decay factor", 0.1,
          rule=within(0, 1, low_open=True)),
)

def check_optimizer(given, strategy) -> None:
    """A setting the chosen optimizer does not read is a one-line error (`given`: the
    [optimizer] settings that were set): it would be silently ignored otherwise. So is
    Downpour's local cadence with any optimizer but sgd: its steps between fetches are plain
    SGD, and a push of k accumulated gradients is k steps' worth, which Adam's
    normalisation would make one (`strategy`: its settings, a switch's halves inside)."""
    name = given.get("optimizer") or "sgd"
    for key, readers in READ_BY.items():
        if key in given and name not in readers:
            raise ConfigError(f"optimizer {name} takes no {key} (read by "
                              f"{', '.join(readers)})")
    halves = [strategy, *(v for v in strategy.values() if isinstance(v, Mapping))]
    for half in halves:
        local = [k for k in ("push_every", "fetch_every") if half.get(k, 1) > 1]
        if name != "sgd" and local:
            raise ConfigError(f"{half['name']} with {local[0]} > 1 takes optimizer sgd only "
                              f"(its accumulated pushes and local steps are SGD's), not {name}")


# General settings added since 0.1 whose default changes nothing: a stored config leaves them
# out at that default, so an older record and its rerun read as the same fields.
LEFT_OUT_AT_DEFAULT = {"shared_epochs": False, "shared_perms": False, "checkpoint_every": 1,
                       "timeout": 300.0, "loss": "cross_entropy", "launcher": "local",
                       "executor_memory": 1024, "spark_conf": [], "min_workers": 1,
                       "dies_after_steps": []}
# Added since 0.1 with a default derived from the strategy: stored only where given.
LEFT_OUT_UNLESS_GIVEN = {"on_worker_failure"}


def stored(key: str, value, given) -> bool:
    """Whether a resolved general setting goes into a stored config (`given`: what was set):
    unset ones do not, nor those left out at their default (above)."""
    if key in LEFT_OUT_UNLESS_GIVEN and key not in given:
        return False
    return value is not None and LEFT_OUT_AT_DEFAULT.get(key, ...) != value
