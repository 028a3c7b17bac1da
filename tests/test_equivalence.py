"""Distributed strategies against single-process training and against each other.

The reference computes each worker's gradient as that worker does (tests/helpers.py), the
workers use one thread each, as it does, and the sums of several workers' gradients are
formed in float64 on both sides: the same operations on any machine and in any arrival
order, so the runs agree to rounding (about 1e-7 here) and 1e-5 holds with room. (With a
union-batch reference and the machine's thread counts, the rounding differences of another
summation order grew over 20 steps to 1.5e-4 on some machines; a float32 server sum in
arrival order moved a 3-worker bsp run by 1.6e-5.) Gloo's all-reduce sums in float32 in its
own order, so allreduce is compared with the reference at 2 workers, where the sum of two
halves is exact, and with bsp at 3 uneven workers, to a tolerance a wrong weighting exceeds
twentyfold.
"""

import pytest
import torch
import torch.nn.functional as F

import polyrhythm
from helpers import (
    equivalence_config,
    max_diff,
    reference_parameters,
    stored_parameters,
    worker_gradient,
)
from polyrhythm.data.sharding import worker_batch_sizes
from polyrhythm.models.build import build_model
from polyrhythm.runtime.job import whole_data


def test_weighted_worker_gradients_are_the_global_gradient(tmp_path):
    # In float64, one step: sum_i (b_i/B) g_i is the gradient of the mean loss over the
    # union of the workers' batches, for an uneven split (22 + 21 + 21 of 64).
    config = equivalence_config(tmp_path, workers=3, batch_size=64)
    _, train, _ = whole_data(config)
    model = build_model(config.model, train.shape, train.classes, config.seed).double()
    x, y = train.batch(slice(0, 64))
    x = x.double()
    sizes = worker_batch_sizes(64, 3)
    weighted = [torch.zeros_like(p) for p in model.parameters()]
    start = 0
    for size in sizes:
        grads = worker_gradient(model, x[start:start + size], y[start:start + size])
        for w, g in zip(weighted, grads, strict=True):
            w.add_(g, alpha=size / 64)
        start += size
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for w, p in zip(weighted, model.parameters(), strict=True):
        assert torch.allclose(w, p.grad, rtol=0, atol=1e-12)
    # Unweighted (each worker's gradient counted alike) would be another step.
    assert sizes == [22, 21, 21]


def test_bsp_one_worker_equals_plain_sgd_loop(tmp_path):
    config = equivalence_config(tmp_path, strategy="bsp", workers=1, servers=1)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 20
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


@pytest.mark.parametrize("servers", [1, 2])
def test_bsp_two_workers_equals_single_process_with_global_batch(tmp_path, servers):
    config = equivalence_config(tmp_path, strategy="bsp", workers=2, servers=servers)
    summary = polyrhythm.train(config)
    assert summary["weight_updates_per_server"] == [20] * servers
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


def test_bsp_and_allreduce_end_with_the_same_parameters(tmp_path):
    # 3 workers share 64 as 22 + 21 + 21. bsp equals the reference to 1e-5 (below); Gloo sums
    # allreduce's float32 gradients in an order of its own, so they may differ by a rounding
    # error grown over the steps. Counting every worker alike (1/3 each) would be caught:
    # that moves the result far more than the tolerance.
    config = equivalence_config(tmp_path, strategy="bsp", workers=3, batch_size=64, seed=7)
    bsp = polyrhythm.train(config)
    allreduce = polyrhythm.train(equivalence_config(tmp_path, strategy="allreduce", workers=3,
                                                    batch_size=64, seed=7))
    assert max_diff(stored_parameters(bsp), stored_parameters(allreduce)) <= 1e-4
    unweighted = reference_parameters(config, weights=[1 / 3] * 3)
    assert max_diff(unweighted, stored_parameters(bsp)) > 20 * 1e-4


def test_uneven_batch_split_still_equals_global_batch(tmp_path):
    # 3 workers share a batch of 64 as 22 + 21 + 21: gradients are weighted by batch share.
    config = equivalence_config(tmp_path, strategy="bsp", workers=3, batch_size=64)
    summary = polyrhythm.train(config)
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


def test_allreduce_two_workers_equals_single_process_with_global_batch(tmp_path):
    # Two halves: weighting by 1/2 is exact, so Gloo's float32 sum is the reference's.
    config = equivalence_config(tmp_path, strategy="allreduce", workers=2)
    summary = polyrhythm.train(config)
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


def test_bsp_with_many_buckets_equals_single_process(tmp_path):
    # 8 KiB buckets: the model travels as dozens of buckets over 2 servers, pushed from
    # gradient hooks while backward still runs, each updated on its own.
    config = equivalence_config(tmp_path, strategy="bsp", workers=2, servers=2, bucket_kb=8)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 20
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5


@pytest.mark.parametrize("dies_after", [7, 13])  # in the first epoch, in the second
def test_bsp_going_on_without_a_lost_worker_equals_its_gradients_until_it_died(tmp_path,
                                                                              dies_after):
    """bsp on 2 servers, 3 workers; worker 2 dies (SIGKILL, on cue) right after its step k.
    The servers go on without it: the run's parameters equal a reference that took all 3
    workers' gradients for the first k steps and the 2 survivors' after them, each keeping
    its weight b_i/B (a step then carries their share of a global batch; the learning rate
    follows the global batches' worth applied). Counting worker 2 to the end, or never,
    would be another model."""
    config = equivalence_config(tmp_path, strategy="bsp", workers=3, servers=2, batch_size=64,
                                on_worker_failure="continue",
                                dies_after_steps=[0, 0, dies_after])
    summary = polyrhythm.train(config)
    (lost,) = summary["lost_workers"]
    assert lost["worker"] == 2 and lost["pushes"] == dies_after
    assert summary["weight_updates_per_server"] == [20, 20]
    stored = stored_parameters(summary)
    assert max_diff(stored, reference_parameters(config, leaves={2: dies_after})) <= 1e-5
    assert max_diff(stored, reference_parameters(config)) > 20 * 1e-5
    assert max_diff(stored, reference_parameters(config, leaves={2: 0})) > 20 * 1e-5


@pytest.mark.parametrize(("strategy", "dies_after", "summed"),
                         [("allreduce", 7, (6, 7)), ("tree", 13, (13,))])
def test_allreduce_going_on_without_a_lost_worker_equals_its_gradients_until_it_died(
        tmp_path, strategy, dies_after, summed):
    """allreduce (its sum then the ring's) and tree, 3 workers; worker 2 dies (SIGKILL, on
    cue) right after its step k. The other two sum on without it: the run's parameters equal
    a reference that took all 3 workers' gradients for the steps the run records it in and
    the 2 survivors' after them, each keeping its weight b_i/B; the learning rate follows
    the epochs, which the survivors step through together.

    Under tree, worker 2 (a leaf) has step k's sum from its parent, which had its gradient:
    its k steps are summed. Under allreduce, whose sums then travel by polyrhythm's ring
    (comm/membership.py), it has its sum once its own last chunk is handed to its socket,
    which the kill may close before the chunk left (a socket closed with data unread is
    reset, what it had yet to send dropped): the survivors may redo step k without it.
    Either way what is recorded is what was trained."""
    config = equivalence_config(tmp_path, strategy=strategy, workers=3, batch_size=64,
                                on_worker_failure="continue",
                                dies_after_steps=[0, 0, dies_after])
    summary = polyrhythm.train(config)
    (lost,) = summary["lost_workers"]
    assert lost["worker"] == 2 and lost["pushes"] in summed
    stored = stored_parameters(summary)
    leaves = {2: lost["pushes"]}
    assert max_diff(stored, reference_parameters(config, leaves=leaves,
                                                 lr_by_epoch=True)) <= 1e-5
    assert max_diff(stored, reference_parameters(config, lr_by_epoch=True)) > 20 * 1e-5


def test_localsgd_going_on_without_a_lost_worker_averages_the_models_left(tmp_path):
    """localsgd with tau = 1 and no momentum (each average then one SGD step of the mean
    gradient), 3 workers; worker 2 dies after its step 7. The others average their models
    over themselves, their weights divided by what they sum to (a mean of models must
    weigh 1): the parameters equal a reference whose survivors take the lost share."""
    config = equivalence_config(tmp_path, strategy="localsgd", tau=1, workers=3,
                                batch_size=64, momentum=0.0, on_worker_failure="continue",
                                dies_after_steps=[0, 0, 7])
    summary = polyrhythm.train(config)
    assert [lost["worker"] for lost in summary["lost_workers"]] == [2]
    stored = stored_parameters(summary)
    assert max_diff(stored, reference_parameters(config, leaves={2: 7}, lr_by_epoch=True,
                                                 renormalised=True)) <= 1e-5
    assert max_diff(stored, reference_parameters(config, leaves={2: 7},
                                                 lr_by_epoch=True)) > 20 * 1e-5
