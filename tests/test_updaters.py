"""Updaters on flat slices (optim.py) against torch.optim on the model's own parameters.

float64 throughout: every update is elementwise, so a slice stepped alone does exactly the
arithmetic the whole parameter does, whatever the thread count."""

from itertools import pairwise

import pytest
import torch

from polyrhythm.errors import ConfigError
from polyrhythm.flat import FlatParameters
from polyrhythm.optim import ELEMENTWISE, FlatSGD, TorchUpdater, cut, joined, slice_groups
from polyrhythm.runtime.worker.user_optimizer import Hyperparameters, UserOptimizer, optimizer_spec

HYPER = {  # away from the defaults, so each hyperparameter is exercised
    "SGD": {"momentum": 0.9, "weight_decay": 1e-2},
    "Adam": {"betas": (0.8, 0.99), "weight_decay": 1e-2},
    "AdamW": {"betas": (0.85, 0.995), "weight_decay": 0.1},
    "RMSprop": {"alpha": 0.95, "momentum": 0.5, "weight_decay": 1e-3},
    "Adagrad": {"weight_decay": 1e-3},
    "Adamax": {"weight_decay": 1e-3},
    "NAdam": {"weight_decay": 1e-3},
    "RAdam": {"weight_decay": 1e-3},
    "Adadelta": {"weight_decay": 1e-3},
}
SIZE = 5 * 6 + 6 + 6 * 5 + 5  # the model's parameters
CUTS = [0, 7, 40, SIZE]  # three slices of the flat model, cutting through parameters


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 5)).double()


def gradients(steps: int, size: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(size, generator=g, dtype=torch.float64) for _ in range(steps)]


def lr(step: int) -> float:
    return 0.01 * 0.9 ** (step // 5)  # changes, as step decay does


def reference(name: str, steps: int) -> torch.Tensor:
    """torch.optim.<name> on the module's own parameters."""
    return trained(lambda params: ELEMENTWISE[name](params, lr=lr(0), **HYPER[name]), steps)


def trained(make_optimizer, steps: int) -> torch.Tensor:
    """The module trained by make_optimizer(its parameters) in one process, each step's
    gradient the flat one cut into its parameters; its parameters, flat."""
    params = list(model().parameters())
    optimizer = make_optimizer(params)
    for i, g in enumerate(gradients(steps, sum(p.numel() for p in params))):
        for group in optimizer.param_groups:
            group["lr"] = lr(i)
        for p, piece in zip(params, g.split([p.numel() for p in params]), strict=True):
            p.grad = piece.view_as(p).clone()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in params])


def sliced(name: str, cuts: list[int], weights: torch.Tensor) -> list[TorchUpdater]:
    return [TorchUpdater(weights[a:b], ELEMENTWISE[name], lr=lr(0), **HYPER[name])
            for a, b in pairwise(cuts)]


def run(updaters, cuts, grads, first: int = 0) -> None:
    for i, g in enumerate(grads, start=first):
        for u, (a, b) in zip(updaters, pairwise(cuts), strict=True):
            u.step(g[a:b].clone(), lr(i))


def flat_weights() -> torch.Tensor:
    """The model's parameters in order, one flat tensor (as flat.py lays them out)."""
    weights = torch.cat([p.detach().flatten() for p in model().parameters()])
    assert weights.numel() == SIZE
    return weights


@pytest.mark.parametrize("name", list(HYPER))
def test_slices_stepped_apart_equal_torch_on_the_whole_model(name):
    weights = flat_weights()
    run(sliced(name, CUTS, weights), CUTS, gradients(20, weights.numel()))
    assert torch.equal(weights, reference(name, 20))


@pytest.mark.parametrize("name", ["SGD", "Adam", "RMSprop", "Adagrad", "NAdam"])
def test_state_resliced_onto_other_slices_carries_on_exactly(name):
    # 10 steps on 2 slices, their states saved, joined and cut for 3 other slices, which
    # take the next 10 steps: torch's 20 steps on the whole model, exactly.
    weights = flat_weights()
    grads = gradients(20, weights.numel())
    two = [0, 50, SIZE]
    before = sliced(name, two, weights)
    run(before, two, grads[:10])
    whole = joined([u.state_dict() for u in before])
    assert all(v.shape == weights.shape for v in whole.values() if v.dim() == 1)
    after = sliced(name, CUTS, weights)
    for u, (a, b) in zip(after, pairwise(CUTS), strict=True):
        u.load_state_dict(cut(whole, a, b))
    run(after, CUTS, grads[10:], first=10)
    assert torch.equal(weights, reference(name, 20))


def test_state_dict_round_trips_and_is_a_copy():
    weights = flat_weights()
    u = TorchUpdater(weights, torch.optim.AdamW, lr=0.01)
    grads = gradients(4, weights.numel())
    run([u], [0, SIZE], grads[:2])
    saved = u.state_dict()
    assert set(saved) == {"step", "exp_avg", "exp_avg_sq"} and float(saved["step"]) == 2
    run([u], [0, SIZE], grads[2:])  # moves the live state, not the copy
    expected = weights.clone()
    weights.copy_(flat_weights())
    fresh = TorchUpdater(weights, torch.optim.AdamW, lr=0.01)
    run([fresh], [0, SIZE], grads[:2])
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    fresh.load_state_dict(saved)
    run([fresh], [0, SIZE], grads[2:])
    assert torch.equal(weights, expected)


def test_updater_steps_the_weights_in_place_through_a_view():
    outbox = torch.zeros(3 + 4, dtype=torch.float64)  # a header, then the weights
    u = TorchUpdater(outbox[3:], torch.optim.SGD, lr=1.0)
    u.step(torch.ones(4, dtype=torch.float64), 0.5)
    assert outbox.tolist() == [0, 0, 0, -0.5, -0.5, -0.5, -0.5]


@pytest.mark.parametrize("cls", [torch.optim.LBFGS, torch.optim.Adafactor])
def test_a_class_that_is_not_elementwise_is_refused_in_one_line(cls):
    with pytest.raises(ConfigError) as refused:
        TorchUpdater(torch.zeros(4), cls, lr=0.1)
    message = str(refused.value)
    assert "\n" not in message and cls.__name__ in message and "not elementwise" in message


def test_a_subclass_of_an_elementwise_class_is_refused():
    class Clipped(torch.optim.Adam):  # may read the whole tensor: not known elementwise
        pass
    with pytest.raises(ConfigError, match="Clipped is not elementwise"):
        TorchUpdater(torch.zeros(4), Clipped)


class Settings:  # the [optimizer] settings FlatSGD reads
    momentum, weight_decay, async_momentum_correction = 0.9, 1e-2, False


def test_flat_sgd_equals_torch_sgd_and_its_state_reslices():
    weights = flat_weights()
    grads = gradients(20, weights.numel())
    two = [0, 50, SIZE]
    before = [FlatSGD(weights[a:b], Settings) for a, b in pairwise(two)]
    run(before, two, grads[:10])
    whole = joined([u.state_dict() for u in before])
    after = [FlatSGD(weights[a:b], Settings) for a, b in pairwise(CUTS)]
    for u, (a, b) in zip(after, pairwise(CUTS), strict=True):
        u.load_state_dict(cut(whole, a, b))
    run(after, CUTS, grads[10:], first=10)
    assert torch.equal(weights, reference("SGD", 20))


# The model's flat layout: weight 0 [0, 30), bias 0 [30, 36), weight 1 [36, 66), bias 1
# [66, 71); weights decay, biases do not (the usual two groups).
GROUPS = [(0, 30, {}), (30, 36, {"weight_decay": 0.0}), (36, 66, {}),
          (66, SIZE, {"weight_decay": 0.0})]


def grouped_reference(steps: int) -> torch.Tensor:
    return trained(lambda params: torch.optim.AdamW(
        [{"params": params[0::2]}, {"params": params[1::2], "weight_decay": 0.0}],
        lr=lr(0), weight_decay=0.1), steps)


def grouped(cuts: list[int], weights: torch.Tensor) -> list[TorchUpdater]:
    return [TorchUpdater(weights[a:b], torch.optim.AdamW, slice_groups(GROUPS, a, b),
                         lr=lr(0), weight_decay=0.1) for a, b in pairwise(cuts)]


def test_param_groups_cut_across_slices_equal_torchs_groups():
    # Slice [7, 40) holds the end of weight 0, bias 0 and the start of weight 1: three
    # groups of its own, two of them decaying.
    assert slice_groups(GROUPS, 7, 40) == [(0, 23, {}), (23, 29, {"weight_decay": 0.0}),
                                           (29, 33, {})]
    weights = flat_weights()
    grads = gradients(20, SIZE)
    two = [0, 50, SIZE]
    before = grouped(two, weights)
    run(before, two, grads[:10])
    whole = joined([u.state_dict() for u in before])
    after = grouped(CUTS, weights)
    for u, (a, b) in zip(after, pairwise(CUTS), strict=True):
        u.load_state_dict(cut(whole, a, b))
    run(after, CUTS, grads[10:], first=10)
    expected = grouped_reference(20)
    assert torch.equal(weights, expected)
    # One group for all (the biases decaying too) is another model: the groups count.
    ungrouped = flat_weights()
    run([TorchUpdater(ungrouped[a:b], torch.optim.AdamW, lr=lr(0), weight_decay=0.1)
         for a, b in pairwise(CUTS)], CUTS, gradients(20, SIZE))
    assert not torch.allclose(ungrouped, expected, rtol=0, atol=1e-9)


def test_groups_must_cover_the_slice_in_order():
    with pytest.raises(ValueError, match="do not cover"):
        TorchUpdater(torch.zeros(10), torch.optim.Adam, [(0, 4, {}), (5, 10, {})])


@pytest.mark.parametrize(("name", "hyper"), [
    *HYPER.items(), ("Adam", {"amsgrad": True}), ("RMSprop", {"centered": True}),
    ("SGD", {})])
def test_the_kept_state_keys_name_what_a_stepped_updater_holds(name, hyper):
    # Read off a probe: settings that add state (AMSGrad's maximum, RMSprop's momentum and
    # centring) are named; SGD without momentum keeps none.
    weights = flat_weights()
    u = TorchUpdater(weights, ELEMENTWISE[name], lr=lr(0), **hyper)
    run([u], [0, SIZE], gradients(2, SIZE))
    elementwise, scalars = u.state_keys
    state = u.state_dict()
    assert set(state) == {*elementwise, *scalars}
    assert all(state[k].shape == weights.shape for k in elementwise)
    assert all(torch.as_tensor(state[k]).dim() == 0 for k in scalars)
    assert ("max_exp_avg_sq" in elementwise) == hyper.get("amsgrad", False)
    assert (elementwise, scalars) != ((), ()) or name == "SGD" and not hyper


def grouped_user_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A user's AdamW, its biases in a group of their own without decay at half the rate."""
    net = model()
    return net, torch.optim.AdamW([{"params": list(net.parameters())[0::2]},
                                   {"params": list(net.parameters())[1::2], "lr": 0.005,
                                    "weight_decay": 0.0}], lr=0.01, weight_decay=0.1)


def steps(updaters, cuts: list[int], grads: list[torch.Tensor], settings=None) -> None:
    """Step each updater by each gradient: the user's own as it is (it keeps its own
    settings), the servers' at `settings`, every group's as a push carries them."""
    for g in grads:
        for u, (a, b) in zip(updaters, pairwise(cuts), strict=True):
            if settings is not None:
                u.follow(settings)
            u.step(g[a:b].clone(), None)


def test_a_users_optimizers_flat_state_is_what_the_servers_take_over():
    # A Strategy-Switch's handover from a script: the user's per-parameter state as one
    # flat state, which the servers' slices of its OptimizerSpec take over exactly (they
    # go on as the user's own optimizer does).
    net, user = grouped_user_optimizer()
    flat = FlatParameters(net)
    spec = optimizer_spec(user, flat, "switch")
    mine = UserOptimizer(user, flat, user.step)
    assert mine.flat_state() == {} and mine.state_keys == spec.state_keys()
    grads = gradients(20, SIZE)
    steps([mine], [0, SIZE], grads[:10])
    whole = mine.flat_state()
    assert float(whole["step"]) == 10 and whole["exp_avg"].shape == (SIZE,)
    assert set(whole) == {*sum(spec.state_keys(), ())}
    on_servers = flat.data.clone()
    servers = [spec.updater(on_servers[a:b], a, b) for a, b in pairwise(CUTS)]
    for u, (a, b) in zip(servers, pairwise(CUTS), strict=True):
        u.load_state_dict(cut(whole, a, b))
    steps(servers, CUTS, grads[10:], Hyperparameters(user).values())
    steps([mine], [0, SIZE], grads[10:])  # the user's own, never interrupted
    assert torch.equal(on_servers, flat.data)


def test_a_users_optimizer_with_a_per_tensor_state_has_no_flat_state():
    net = model()
    adafactor = torch.optim.Adafactor(net.parameters(), lr=0.01)
    mine = UserOptimizer(adafactor, FlatParameters(net), adafactor.step)
    steps([mine], [0, SIZE], gradients(1, SIZE))
    with pytest.raises(ConfigError, match="^Adafactor keeps its state per whole tensor, "
                                          "which has no flat form$"):
        mine.flat_state()
