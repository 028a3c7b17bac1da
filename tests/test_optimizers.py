"""The run's optimizer (`optimizer = "adamw"`, ...) on servers and workers against plain
torch.optim in one process, and its settings' one-line errors. Same reference as
test_equivalence.py (helpers.reference_parameters), with the run's optimizer class."""

from functools import partial

import pytest
import torch

import polyrhythm
from helpers import equivalence_config, max_diff, reference_parameters, stored_parameters
from polyrhythm.config import RunConfig, make_config
from polyrhythm.config.declared import OPTIMIZERS
from polyrhythm.errors import ConfigError
from polyrhythm.optim import TORCH_OPTIMIZERS, state_keys, state_of, state_pieces, updater
from polyrhythm.runtime.server.server import Bucket, run_updater
from polyrhythm.strategies.consistency import AsynchronousPolicy, SoftSynchronousPolicy
from polyrhythm.strategies.server_updates.mean import GradientMean
from polyrhythm.strategies.server_updates.sum import GradientSum

ADAMW = {"optimizer": "adamw", "lr": 0.003, "betas": [0.8, 0.99], "weight_decay": 0.1}


def sgd_of(config):
    """The same run with the default optimizer: what a run that ignored its optimizer did."""
    fields = {k: v for k, v in config.to_dict()["optimizer"].items()
              if k not in ("optimizer", "betas", "eps")}
    return make_config({**config.to_dict(), "optimizer": fields})


def test_bsp_two_servers_with_adamw_equals_one_process(tmp_path):
    # 8 KiB buckets: dozens of slices over 2 servers, cutting through parameters, each with
    # its own AdamW state and step count; 2 epochs of 10 steps, lr decayed after the first.
    config = equivalence_config(tmp_path, strategy="bsp", workers=2, servers=2, bucket_kb=8,
                                **ADAMW)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 20 and summary["server_momentum"] is None
    stored = stored_parameters(summary)
    assert max_diff(stored, reference_parameters(config)) <= 1e-5
    assert max_diff(stored, reference_parameters(sgd_of(config))) > 1e-3


def test_allreduce_with_adam_equals_one_process(tmp_path):
    # Two halves: the weighted sum is exact in float32, as in test_equivalence.py.
    config = equivalence_config(tmp_path, strategy="allreduce", workers=2, optimizer="adam",
                                lr=0.002, eps=1e-6)
    summary = polyrhythm.train(config)
    stored = stored_parameters(summary)
    assert max_diff(stored, reference_parameters(config)) <= 1e-5
    assert max_diff(stored, reference_parameters(sgd_of(config))) > 1e-3


def test_localsgd_workers_step_the_runs_optimizer(tmp_path):
    # One worker: its own steps are the whole run, so its local RMSprop is the reference's.
    config = equivalence_config(tmp_path, strategy="localsgd", workers=1, tau=4,
                                optimizer="rmsprop", lr=0.001)
    stored = stored_parameters(polyrhythm.train(config))
    assert max_diff(stored, reference_parameters(config)) <= 1e-5
    assert max_diff(stored, reference_parameters(sgd_of(config))) > 1e-3


def test_the_declared_names_are_the_ones_the_servers_run():
    assert set(OPTIMIZERS) == {"sgd", *TORCH_OPTIMIZERS}


def test_the_optimizer_is_named_in_its_section_or_flat_and_stored_only_when_set():
    sectioned = RunConfig(optimizer={"name": "rmsprop", "eps": 1e-6})
    flat = RunConfig(optimizer="rmsprop", eps=1e-6)
    assert sectioned == flat and flat.optimizer.optimizer == "rmsprop"
    assert RunConfig(**flat.to_dict()) == flat
    assert "optimizer" not in RunConfig().to_dict()["optimizer"]  # sgd runs stored as before
    assert RunConfig(strategy="downpour", optimizer="adam").optimizer.optimizer == "adam"
    assert RunConfig(strategy="downpour", push_every=2).strategy.push_every == 2


@pytest.mark.parametrize(("fields", "message"), [
    ({"optimizer": "lamb"}, "optimizer must be one of sgd, adam, adamw, rmsprop, adagrad, "
                            "got 'lamb'"),
    ({"betas": [0.9, 0.999]}, "optimizer sgd takes no betas (read by adam, adamw)"),
    ({"optimizer": "adagrad", "betas": [0.9, 0.9]}, "optimizer adagrad takes no betas"),
    ({"optimizer": "adam", "betas": [0.9]}, "betas must be two numbers in [0, 1), got [0.9]"),
    ({"optimizer": "adam", "betas": [0.9, 1.0]}, "betas must be two numbers in [0, 1)"),
    ({"optimizer": "adam", "strategy": "downpour", "push_every": 2},
     "downpour with push_every > 1 takes optimizer sgd only (its accumulated pushes and "
     "local steps are SGD's), not adam"),
    ({"optimizer": "rmsprop", "strategy": "switch", "to": "downpour", "fetch_every": 3},
     "downpour with fetch_every > 1 takes optimizer sgd only"),
])
def test_bad_optimizer_settings_are_one_line(fields, message):
    with pytest.raises(ConfigError) as bad:
        RunConfig(**fields)
    assert str(bad.value).startswith(message) and "\n" not in str(bad.value)


def adam_bucket(policy, server_update=GradientSum):
    """A server bucket of 50 weights under `policy` and `server_update`, stepping Adam; and
    torch's Adam on a copy of the same weights."""
    initial = torch.randn(50, generator=torch.Generator().manual_seed(3))
    settings = RunConfig(optimizer="adam", lr=0.01).optimizer
    param = torch.nn.Parameter(initial.clone())
    reference = torch.optim.Adam([param], weight_decay=settings.weight_decay)
    return (Bucket(initial, 0, 50, policy, partial(server_update, settings=None, workers=4),
                   partial(run_updater, settings)), settings, param, reference)


def test_an_asynchronous_push_scales_adams_step_by_its_batch_share():
    # Adam cancels a gradient's scale: weighting the gradient by the push's batch share (as
    # SGD's servers do) would step each push as far as a whole global batch. The server
    # hands Adam the gradient itself and scales the learning rate by the share instead.
    bucket, settings, param, reference = adam_bucket(AsynchronousPolicy(4))
    g = torch.Generator().manual_seed(4)
    for share in [0.25, 0.5, 0.25, 0.25, 0.125]:
        grad = torch.randn(50, generator=g)
        bucket.accumulate(grad, share)
        bucket.apply(settings, steps_per_epoch=1000)
        reference.param_groups[0]["lr"] = 0.01 * share
        param.grad = grad
        reference.step()
    assert torch.equal(bucket.weights, param.detach())
    assert bucket.optimizer.state_dict()["step"] == 5


def test_a_staleness_scaled_gradient_scales_adams_step_not_its_gradient():
    # softsync averages its quorum's gradients, a stale one scaled by 1/staleness: Adam
    # gets their mean weighted by share x scale, at the learning rate times the mean scale.
    bucket, settings, param, reference = adam_bucket(SoftSynchronousPolicy(2, 2, 0.1), GradientMean)
    g = torch.Generator().manual_seed(5)
    fresh, stale = torch.randn(50, generator=g), torch.randn(50, generator=g)
    bucket.accumulate(fresh, 0.5)
    bucket.accumulate(stale, 0.5, scale=0.5)
    bucket.apply(settings, steps_per_epoch=1000)
    summed = (fresh.double() * 0.5).add_(stale.double(), alpha=0.25).float()  # as the server
    param.grad = summed.div_(0.75)
    reference.param_groups[0]["lr"] = 0.01 * 0.75
    reference.step()
    assert torch.equal(bucket.weights, param.detach())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_handovers_state_keys_are_what_each_optimizer_keeps(name):
    # The servers size the handover by state_keys; the worker packs its updater's. Both
    # must name all the updater keeps once stepped, or part of it would be lost at a switch.
    settings = RunConfig(optimizer=name).optimizer
    keys = state_keys(settings)
    fresh = updater(torch.zeros(6), settings)
    assert fresh.state_keys == keys
    tensors, values = state_pieces(fresh.state_dict(), keys, 6)  # before any step
    assert all(t.abs().max() == 0 for t in tensors) and all(v == 0 for v in values)
    stepped = updater(torch.zeros(6), settings)
    stepped.step(torch.arange(6.0), 0.1)
    state = stepped.state_dict()
    elementwise, scalars = keys
    assert set(state) == {*elementwise, *scalars}
    assert all(state[k].shape == (6,) for k in elementwise)
    tensors, values = state_pieces(state, keys, 6)
    again = state_of(tensors, values, keys)
    assert all(torch.equal(again[k], state[k]) for k in state)
