"""RunConfig: strategy parameters resolve per strategy and a stored config loads back as is."""

import copy
import pickle
import tomllib

import pytest
import tomli_w

from polyrhythm.config import flat_config, flat_keys, make_config, unread_fields
from polyrhythm.errors import ConfigError
from polyrhythm.metrics.records import config_fields
from polyrhythm.strategies import STRATEGIES


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_stored_config_loads_back_to_the_same_run(strategy):
    config = make_config({"strategy": strategy, "workers": 4})
    again = make_config(tomllib.loads(config.to_toml()))
    assert again == config
    # Only the strategy's own parameters are stored, in its section.
    stored = tomllib.loads(config.to_toml())["strategy"]
    assert set(stored) - {"name"} <= {p.name for p in STRATEGIES[strategy].params}


def test_defaults_that_depend_on_the_worker_count():
    assert make_config({"strategy": "kbsp", "workers": 5}).strategy.quorum == 4
    assert make_config({"strategy": "kasp", "workers": 5}).strategy.quorum == 2
    assert make_config({"strategy": "softsync", "workers": 5}).strategy.quorum == 1
    assert make_config({"strategy": "easgd", "workers": 3}).strategy.alpha == pytest.approx(0.3)
    assert make_config({"strategy": "kbsp", "workers": 5, "quorum": 2}).strategy.quorum == 2


def test_bucket_size_only_where_buckets_exist():
    assert make_config({"strategy": "bsp"}).bucket_kb == 25600
    assert make_config({"strategy": "kbsp"}).bucket_kb is None  # one bucket
    assert make_config({"strategy": "ssp"}).bucket_kb == 25600
    assert make_config({"strategy": "ssp", "value_bound": 0.1}).bucket_kb is None
    assert make_config({"strategy": "ring"}).bucket_kb is None


def test_switching_strategy_drops_the_resolved_parameters_of_the_old_one():
    from polyrhythm.api import resolve_config

    kbsp = make_config({"strategy": "kbsp", "workers": 4})
    bsp = resolve_config(kbsp, strategy="bsp")
    assert "quorum" not in bsp.strategy and bsp.servers == 1


def test_flat_keys_sections_and_both_give_the_same_config():
    flat = make_config({"strategy": "ssp", "staleness": 2, "dataset": "digits", "lr": 0.1,
                        "workers": 2})
    sections = make_config({"workers": 2, "strategy": {"name": "ssp", "staleness": 2},
                            "data": {"name": "digits"}, "optimizer": {"lr": 0.1}})
    mixed = make_config({"workers": 2, "strategy": "ssp", "staleness": 2,
                         "data": {"name": "digits"}, "lr": 0.1})
    assert flat == sections == mixed
    assert flat.strategy.staleness == 2 and flat.data.name == "digits"
    assert flat.optimizer.lr == 0.1


@pytest.mark.parametrize(("values", "message"), [
    ({"dataset": "mnist5k", "synthetic_size": 100},
     "dataset 'mnist5k' takes no --synthetic-size (its parameters: --val-fraction, "
     "--sharding, --components, --clusters, --max-iter; --synthetic-size is for synthetic)"),
    ({"data": "digits"}, "data must be a table ([data]); or dataset = ..., got 'digits'"),
    ({"seed": -1}, "seed must be at least 0, got -1"),
    ({"strategy": {"name": "bsp", "lr": 0.1}}, "lr belongs in [optimizer], not [strategy]"),
    ({"strategy": {"name": "bsp", "nme": 1}}, "unknown config key 'strategy.nme'"),
    ({"tau": 2, "strategy": {"name": "localsgd", "tau": 3}}, "strategy.tau is given twice"),
    ({"strategy": 3}, "strategy must be a valid string, got 3"),
    ({"workers": True}, "workers must be a valid integer, got True"),
    ({"lr": "fast"}, "lr must be a valid number, got 'fast'"),
    ({"worker_delay_s": [0.1, -1]}, "worker_delay_s must have entries of at least 0"),
])
def test_bad_values_are_one_line_errors(values, message):
    with pytest.raises(ConfigError) as info:
        make_config(values)
    assert message in str(info.value) and "\n" not in str(info.value)


RELEASE_0_1 = {"strategy": "bsp", "workers": 2, "servers": 1, "epochs": 2, "batch_size": 64,
               "lr": 0.05, "momentum": 0.9, "async_momentum_correction": True,
               "weight_decay": 1e-4, "lr_decay_every": 0, "lr_decay": 0.1, "dataset": "digits",
               "synthetic_shape": [1, 8, 8], "synthetic_classes": 10, "synthetic_size": 2000,
               "val_fraction": 0.1, "model": "cnn", "seed": 0, "worker_delay_s": [],
               "warmup_steps": 5, "instrumentation": True, "out": "runs", "bucket_kb": 25600}


def test_a_config_written_by_release_0_1_loads_without_its_unread_synthetic_fields():
    old = RELEASE_0_1
    config = make_config(old)
    assert config.data.to_dict() == {"name": "digits", "val_fraction": 0.1}
    # Not a whole 0.1 record: the unread field is an error as for any hand-written config.
    partial = {k: v for k, v in old.items() if k != "instrumentation"}
    with pytest.raises(ConfigError, match="takes no --synthetic-shape"):
        make_config(partial)


def test_a_sweep_drops_what_a_point_does_not_read():
    fields = {"strategy": "bsp", "tau": 2, "dataset": "digits", "synthetic_size": 50,
              "servers": 1, "bucket_kb": 8}
    assert unread_fields(fields) == {"tau", "synthetic_size"}
    assert unread_fields({**fields, "strategy": "allreduce"}) == {
        "tau", "synthetic_size", "servers", "bucket_kb"}
    assert set(flat_keys()) >= {"strategy", "dataset", "model", "tau", "lr", "workers"}
    # Compression: replies only where servers reply, its settings only where it compresses,
    # each compressor's parameters only for it.
    compressed = {"strategy": "bsp", "compress": "topk", "ratio": 0.1, "levels": 3,
                  "compress_replies": True, "error_feedback": False}
    assert unread_fields(compressed) == {"levels"}
    assert unread_fields({**compressed, "strategy": "ring"}) == {"levels", "compress_replies"}
    assert unread_fields({**compressed, "compress": "none"}) == {
        "levels", "ratio", "compress_replies", "error_feedback"}


def test_a_config_pickles_and_copies_to_the_same_run():
    config = make_config({"strategy": "kbsp", "workers": 4, "lr": 0.1})
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.given == config.given
    assert copy.deepcopy(config.strategy) == config.strategy


def test_a_stored_0_1_config_reads_as_the_same_fields_as_its_rerun():
    # So a report of old and new runs of the same job groups them together.
    old = tomli_w.dumps(RELEASE_0_1)
    new = make_config(RELEASE_0_1).to_toml()
    assert config_fields(old) == config_fields(new)


def test_sweeps_take_a_base_in_sections_and_flags_win_over_a_file():
    base = flat_config({"workers": 2, "strategy": {"name": "localsgd", "tau": 2},
                        "optimizer": {"lr": 0.1}}, {"lr": 0.2, "tau": 3})
    assert base == {"workers": 2, "strategy": "localsgd", "tau": 3, "lr": 0.2}
    with pytest.raises(ConfigError, match="tau is given twice"):
        flat_config({"tau": 2, "strategy": {"name": "localsgd", "tau": 3}})


@pytest.mark.parametrize(("values", "message"), [
    ({"workers": 4, "slowdown": [1, 1, 3]}, "slowdown needs one value per worker (4), got 3"),
    ({"workers": 2, "slowdown": [1, 1, 3]}, "slowdown needs one value per worker (2), got 3"),
    ({"workers": 3, "worker_delay_s": [0.05]},
     "worker_delay_s needs one value per worker (3), got 1"),
    ({"workers": 4, "hosts": 3, "cpu": [1, 1]}, "cpu needs one value, or one per host (3), got 2"),
    ({"workers": 2, "workers_per_host": 1, "bandwidth": ["1gbit"] * 2},  # 1 server's host too
     "bandwidth needs one value, or one per host (3), got 2"),
])
def test_a_list_has_one_value_per_worker_or_per_host(values, message):
    with pytest.raises(ConfigError) as info:
        make_config(values)
    assert str(info.value) == message


def test_lists_of_the_right_length_and_an_empty_one_are_taken():
    config = make_config({"workers": 4, "slowdown": [1, 1, 1, 3], "worker_delay_s": [],
                          "hosts": 3, "cpu": [0.5]})
    assert config.slowdown == [1, 1, 1, 3] and config.worker_delay_s == []
    assert make_config({"workers": 4, "hosts": 3, "cpu": [1, 1, 0.5]}).cluster.cpu == [1, 1, 0.5]
