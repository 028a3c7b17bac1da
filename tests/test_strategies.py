"""Parameter-server strategies trained for real on mnist5k, in separate processes."""

import pytest

import polyrhythm


def test_asp_makes_n_times_the_updates_of_bsp_and_still_learns(tmp_path):
    common = {"workers": 4, "epochs": 3, "out": str(tmp_path)}
    bsp = polyrhythm.train(strategy="bsp", **common)
    asp = polyrhythm.train(strategy="asp", **common)
    assert asp["weight_updates"] == 4 * bsp["weight_updates"]
    assert bsp["staleness_max"] == 0
    assert asp["staleness_max"] > 0 and asp["staleness_mean"] > 0
    assert asp["final_val_accuracy"] >= 0.85
    assert bsp["final_val_accuracy"] >= 0.85
    assert asp["server_momentum"] == pytest.approx(0.9 - 0.75)  # asynchrony's momentum removed
    assert bsp["server_momentum"] == 0.9


def test_ssp_holds_fast_workers_back_behind_a_slow_one(tmp_path):
    # Worker 0 computes 40 ms slower per step. Under ASP the others race ahead and finish
    # early; under SSP with s = 1 they may lead by at most 1 clock, so they wait for it.
    common = {"workers": 3, "epochs": 1, "steps_per_epoch": 25, "worker_delay_s": [0.04],
              "out": str(tmp_path)}
    asp = polyrhythm.train(strategy="asp", **common)
    ssp = polyrhythm.train(strategy="ssp", staleness=1, **common)

    def fast_over_slow(summary):
        slow, *fast = summary["per_worker"]
        return max(w["train_s"] for w in fast) / slow["train_s"]

    assert fast_over_slow(asp) < 0.6
    assert fast_over_slow(ssp) > 0.85
    fast_wait = [w["pull_s"] for w in ssp["per_worker"][1:]]
    assert min(fast_wait) > 0.5 * 25 * 0.04  # most of the slow worker's extra time
    # Each fast worker (2 of them) can apply at most s + 1 = 2 updates per slow clock, so
    # the slow worker's gradients are at most about 2 * 2 updates stale.
    assert ssp["staleness_max"] <= 2 * (1 + 1) + 1
    assert asp["staleness_max"] > ssp["staleness_max"]
