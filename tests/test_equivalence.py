"""Distributed strategies against single-process training and against each other."""

import pytest

import polyrhythm
from helpers import reference_parameters, small_config, stored_parameters


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def test_bsp_one_worker_equals_plain_sgd_loop(tmp_path):
    config = small_config(tmp_path, strategy="bsp", workers=1, servers=1)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 20
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


@pytest.mark.parametrize("servers", [1, 2])
def test_bsp_two_workers_equals_single_process_with_global_batch(tmp_path, servers):
    config = small_config(tmp_path, strategy="bsp", workers=2, servers=servers)
    summary = polyrhythm.train(config)
    assert summary["weight_updates_per_server"] == [20] * servers
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


def test_bsp_and_allreduce_end_with_the_same_parameters(tmp_path):
    common = {"workers": 3, "batch_size": 60, "seed": 7}
    bsp = polyrhythm.train(small_config(tmp_path, strategy="bsp", **common))
    allreduce = polyrhythm.train(small_config(tmp_path, strategy="allreduce", **common))
    assert max_diff(stored_parameters(bsp), stored_parameters(allreduce)) <= 1e-4


def test_uneven_batch_split_still_equals_global_batch(tmp_path):
    # 3 workers share a batch of 64 as 22 + 21 + 21: gradients are weighted by batch share.
    config = small_config(tmp_path, strategy="allreduce", workers=3, batch_size=64)
    summary = polyrhythm.train(config)
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


def test_bsp_with_many_buckets_equals_single_process(tmp_path):
    # 8 KiB buckets: the model travels as dozens of buckets over 2 servers, pushed from
    # gradient hooks while backward still runs, each updated on its own.
    config = small_config(tmp_path, strategy="bsp", workers=2, servers=2, bucket_kb=8)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 20
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5
