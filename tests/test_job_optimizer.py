"""The optimizer job.wrap returns (runtime/worker/job_optimizer.py): a thin torch Optimizer over the
script's own, whose step is the job's; torch's schedulers, hooks and state work through it
with nothing patched, and an optimizer stepped around it is one line."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from polyrhythm.errors import ConfigError
from polyrhythm.runtime.worker.job_optimizer import JobOptimizer, guard_steps
from polyrhythm.runtime.worker.script import Job


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)) for _ in range(6)]


def test_a_script_alone_trains_what_its_plain_loop_trains_with_its_scheduler_made_before():
    model, opt, sched = build()
    for x, y in batches():
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    plain = [p.detach().clone() for p in model.parameters()]

    model, opt, sched = build()
    job = Job(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()"
        model, wrapped = job.wrap(model, opt)
        for x, y in batches():
            job.backward(torch.nn.functional.mse_loss(model(x), y))
            wrapped.step()
            wrapped.zero_grad()
            sched.step()
    assert isinstance(wrapped, torch.optim.Optimizer) and wrapped is not opt
    assert wrapped.param_groups is opt.param_groups and wrapped.state is opt.state
    assert opt.param_groups[0]["lr"] == 0.05 * 0.5 ** 3
    assert all(torch.equal(a, b) for a, b in zip(plain, model.parameters(), strict=True))


def test_where_servers_step_the_model_the_scripts_optimizer_steps_with_no_gradient():
    """The exchange left the next parameters in the model: the script's optimizer's own
    step runs once, applying nothing, so its scheduler and step hooks see the step; the
    gradients are the script's again afterwards."""
    model, opt, sched = build()
    exchanged = []
    wrapped = JobOptimizer(opt, lambda: exchanged.append(True))
    seen = []
    wrapped.register_step_post_hook(lambda optimizer, args, kwargs: seen.append(optimizer))
    torch.nn.functional.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 1)).backward()
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped.step()
        sched.step()
    assert exchanged == [True] and seen == [opt]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert [p.grad for p in model.parameters()] == grads and opt.state == {}


def test_a_scheduler_made_on_the_wrapped_optimizer_sets_the_scripts_rates():
    model, opt, _ = build()
    wrapped = JobOptimizer(opt, lambda: None)
    sched = torch.optim.lr_scheduler.LambdaLR(wrapped, lambda step: 1 / (step + 1))
    for _ in range(3):
        wrapped.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 4)
    assert wrapped.state_dict() == opt.state_dict()


def test_an_optimizer_stepped_around_the_job_is_one_line():
    """As a job's process has it (Job registers the guard): the wrapped optimizer's own step
    inside the job's is the job's; stepped directly, or another optimizer, one line."""
    model, opt, _ = build()
    wrapped = JobOptimizer(opt, lambda: None)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = register_optimizer_step_pre_hook(guard_steps(lambda: wrapped))
    try:
        wrapped.step()
        with pytest.raises(ConfigError, match="the script stepped the AdamW it gave job.wrap, "
                                              "not the optimizer job.wrap returned"):
            opt.step()
        with pytest.raises(ConfigError, match=r"an optimizer \(SGD\) was stepped without "
                                              "job.wrap"):
            other.step()
        other.polyrhythm_internal = True  # the run's own: never refused
        other.step()
    finally:
        handle.remove()
    with pytest.raises(ConfigError, match="takes no closure"):
        wrapped.step(lambda: 0.0)
    torch.optim.SGD(model.parameters(), lr=0.1).step()  # the guard went with its handle
    guard_steps(lambda: False)(opt, (), {})  # nor does a job let go of guard any more
