"""Shared epochs: an epoch is the servers' count of applied global batches, taken by whichever
workers are ready (TensorFlow's parameter-server coordinator hands out steps so)."""

from __future__ import annotations

import pytest

import polyrhythm
from helpers import equivalence_config, max_diff, small_config, stored_parameters
from polyrhythm.config import make_config
from polyrhythm.errors import ConfigError


def test_a_slow_worker_takes_fewer_of_the_runs_steps(tmp_path):
    # Worker 1 sleeps 50 ms a step, worker 0 computes a digits step in a few: the run's 40
    # global batches (2 epochs of 20) are still 80 pushes, most of them worker 0's.
    summary = polyrhythm.train(small_config(tmp_path, strategy="asp", workers=2, epochs=2,
                                            steps_per_epoch=20, dataset="digits",
                                            worker_delay_s=[0.0, 0.05], shared_epochs=True))
    assert summary["weight_updates"] == 2 * 20 * 2
    fast, slow = (w["steps"] for w in summary["per_worker"])
    assert fast > slow > 0
    # Each worker's steps are the applied pushes, plus at most one cancelled after the end.
    assert 80 <= fast + slow <= 81
    assert len(summary["epoch_metrics"]) == 2


def test_in_lockstep_shared_epochs_change_nothing(tmp_path):
    # bsp: every round applies one global batch, so the servers' count and each worker's own
    # steps end the epochs at the same steps.
    own = polyrhythm.train(equivalence_config(tmp_path, strategy="bsp", workers=2))
    shared = polyrhythm.train(equivalence_config(tmp_path, strategy="bsp", workers=2,
                                                 shared_epochs=True))
    assert max_diff(stored_parameters(own), stored_parameters(shared)) == 0
    assert [w["steps"] for w in shared["per_worker"]] == [20, 20]


@pytest.mark.parametrize(("strategy", "message"), [
    ("allreduce", "shared_epochs needs parameter servers; strategy 'allreduce' has none"),
    ("easgd", "strategy 'easgd' takes no shared_epochs (its servers add elastic differences"),
    ("kbsp", "strategy 'kbsp' takes no shared_epochs (its servers end the run after a fixed"),
])
def test_shared_epochs_need_servers_that_count_gradients(strategy, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        make_config({"strategy": strategy, "workers": 2, "shared_epochs": True})
