"""The server updates (strategies/server_updates/): what a bucket's update does with the
pushes its policy gathers, tested on real buckets without processes. DC-ASGD against its
formula and against asp; the sum, the mean and EASGD's centre by their arithmetic."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import polyrhythm
from helpers import max_diff, stored_parameters
from polyrhythm.config import RunConfig
from polyrhythm.runtime.server.bucket import Bucket, run_updater
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.consistency import AsynchronousPolicy, QuorumSynchronousPolicy
from polyrhythm.strategies.server_updates.dcasgd import compensated

SIZE, WORKERS, LR = 40, 3, 0.1
PLAIN_SGD = {"lr": LR, "momentum": 0.0, "weight_decay": 0.0}  # w <- w - lr g


def bucket(strategy: str, policy=None, **settings) -> Bucket:
    """A one-bucket server of SIZE weights under `strategy`'s server update (SGD without
    momentum at LR), and its policy (the strategy's own by default)."""
    config = RunConfig(strategy=strategy, workers=WORKERS, **PLAIN_SGD, **settings)
    spec = STRATEGIES[strategy]
    initial = torch.randn(SIZE, generator=torch.Generator().manual_seed(1))
    policy = policy or spec.policy(config.strategy, WORKERS)
    return Bucket(initial, 0, SIZE, policy, spec.server_updates(config.strategy, WORKERS),
                  partial(run_updater, config.optimizer))


def gradients(n: int, seed: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SIZE, generator=g) for _ in range(n)]


def stale_pushes(server: Bucket, grads: list[torch.Tensor]) -> None:
    """Every worker pulls, then they push one after another, each on the weights it pulled:
    worker w's push is w updates stale. Each push is its own update (asp), weight 1/N."""
    for w in range(WORKERS):
        server.reply(w)
    for w, grad in enumerate(grads):
        server.accumulate(grad, 1 / WORKERS, worker=w, applied_next=True)
        server.apply(server_settings(), steps_per_epoch=100)
        server.reply(w)


def server_settings():
    return RunConfig(**PLAIN_SGD).optimizer


def test_a_delay_compensated_push_steps_by_the_formula():
    """Worker 2 pulled w_bak; workers 0 and 1 moved the weights to w since; worker 2's
    gradient g then steps by g + λ·g⊙g⊙(w − w_bak), weighted by its batch share."""
    server = bucket("dcasgd", dc_lambda=0.5)
    pulled = server.weights.clone()
    g0, g1, g2 = gradients(3)
    stale_pushes(server, [g0, g1])
    for w in range(2):
        server.reply(w)
    w = server.weights.clone()
    assert max_diff(w, pulled) > 0  # the weights moved since worker 2 pulled
    server.accumulate(g2, 1 / WORKERS, worker=2, applied_next=True)
    server.apply(server_settings(), steps_per_epoch=100)
    expected = w - LR / WORKERS * (g2 + 0.5 * g2 * g2 * (w - pulled))
    assert torch.allclose(server.weights, expected, rtol=0, atol=1e-6)


def test_delay_compensation_with_lambda_0_is_asp_bit_for_bit_and_with_lambda_it_differs():
    grads = gradients(WORKERS)
    asp, dc0, dc = bucket("asp"), bucket("dcasgd", dc_lambda=0.0), bucket("dcasgd")
    for server in (asp, dc0, dc):
        stale_pushes(server, grads)
    assert torch.equal(dc0.weights, asp.weights)
    assert max_diff(dc.weights, asp.weights) > 1e-6  # the stale pushes were compensated


def test_the_compensation_is_zero_on_fresh_weights_and_grows_with_the_change():
    g, w = gradients(2)
    assert torch.equal(compensated(g, w, w.clone(), 0.04), g)  # nothing moved: g itself
    moved = w + 0.1
    assert torch.allclose(compensated(g, moved, w, 0.04) - g, 0.04 * g * g * 0.1, atol=1e-7)


def test_each_workers_backup_is_what_it_was_answered_with_and_a_checkpoint_keeps_it():
    server = bucket("dcasgd")
    stale_pushes(server, gradients(WORKERS))
    update = server.server_update
    assert torch.equal(update.backups[WORKERS - 1], server.weights)  # answered last
    assert not torch.equal(update.backups[0], server.weights)  # answered before two updates
    again = bucket("dcasgd")
    again.load_state_dict(server.state_dict())
    assert torch.equal(again.server_update.backups, update.backups)
    assert torch.equal(again.weights, server.weights)


def test_the_mean_divides_by_the_gathered_weight_and_the_sum_does_not():
    """k-BSP's update of the first 2 of 3 workers is their mean at the full rate; asp's
    pushes each step by their batch share."""
    g0, g1 = gradients(2)
    kbsp = bucket("kbsp", QuorumSynchronousPolicy(WORKERS, 2))
    before = kbsp.weights.clone()
    for w, grad in enumerate((g0, g1)):
        kbsp.accumulate(grad, 1 / WORKERS, worker=w)
    kbsp.apply(server_settings(), steps_per_epoch=100)
    mean = ((g0.double() + g1.double()) / 2).float()
    assert torch.allclose(kbsp.weights, before - LR * mean, rtol=0, atol=1e-6)
    asp = bucket("asp", AsynchronousPolicy(WORKERS))
    asp.accumulate(g0, 1 / WORKERS, worker=0)
    asp.apply(server_settings(), steps_per_epoch=100)
    assert torch.allclose(asp.weights, before - LR / WORKERS * g0, rtol=0, atol=1e-6)


def test_the_elastic_centre_adds_the_differences_and_steps_no_optimizer():
    easgd = bucket("easgd")
    before = easgd.weights.clone()
    d0, d1 = gradients(2)
    easgd.accumulate(d0, 1.0, worker=0, applied_next=True)  # weight 1: d is added as it is
    easgd.apply(server_settings(), steps_per_epoch=100)
    easgd.accumulate(d1, 1.0, worker=1, applied_next=True)
    easgd.apply(server_settings(), steps_per_epoch=100)
    assert easgd.optimizer is None
    assert torch.equal(easgd.weights, before + d0 + d1)


def test_a_dcasgd_run_of_one_worker_is_an_asp_run(tmp_path):
    """One worker always pulls what the server holds: nothing to compensate, whatever λ."""
    job = {"dataset": "digits", "workers": 1, "servers": 1, "epochs": 1, "steps_per_epoch": 8,
           "threads": 1, "seed": 4}
    asp = polyrhythm.train({**job, "strategy": "asp", "out": str(tmp_path / "asp")})
    dc = polyrhythm.train({**job, "strategy": "dcasgd", "dc_lambda": 2.0,
                           "out": str(tmp_path / "dc")})
    assert max_diff(stored_parameters(dc), stored_parameters(asp)) == 0
    assert dc["weight_updates"] == asp["weight_updates"] == 8


@pytest.mark.parametrize("value", [-0.1, "x"])
def test_a_bad_lambda_is_one_line(value):
    with pytest.raises(polyrhythm.errors.ConfigError) as bad:
        RunConfig(strategy="dcasgd", dc_lambda=value)
    assert "dc_lambda" in str(bad.value) and "\n" not in str(bad.value)
