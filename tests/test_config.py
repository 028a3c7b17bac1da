"""RunConfig: strategy parameters resolve per strategy and a stored config loads back as is."""

import tomllib

import pytest

from polyrhythm.config import STRATEGY_PARAMETERS, make_config
from polyrhythm.strategies import STRATEGIES


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_stored_config_loads_back_to_the_same_run(strategy):
    config = make_config({"strategy": strategy, "workers": 4})
    again = make_config(tomllib.loads(config.to_toml()))
    assert again == config
    # Only the strategy's own parameters are stored.
    stored = set(tomllib.loads(config.to_toml())) & STRATEGY_PARAMETERS
    assert stored <= set(STRATEGIES[strategy].parameters)


def test_defaults_that_depend_on_the_worker_count():
    assert make_config({"strategy": "kbsp", "workers": 5}).quorum == 4
    assert make_config({"strategy": "kasp", "workers": 5}).quorum == 2
    assert make_config({"strategy": "softsync", "workers": 5}).quorum == 1
    assert make_config({"strategy": "easgd", "workers": 3}).alpha == pytest.approx(0.3)
    assert make_config({"strategy": "kbsp", "workers": 5, "quorum": 2}).quorum == 2


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
    assert bsp.quorum is None and bsp.servers == 1
