"""Every piece of a run has a state that saves and loads: after a real two-worker run of k
steps, each rank's role (server shard or worker) saves its state, a freshly built role loads
it, and saves the same tensors and counters again."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import play_ranks
from polyrhythm.comm.transport import Transport
from polyrhythm.config import make_config
from polyrhythm.context import RankContext, Topology
from polyrhythm.data.datasets import open_source
from polyrhythm.models import MODELS, ModelSpec
from polyrhythm.runtime.job import build_role, plan_data

STEPS = 5


def assert_same(a, b, where: str = "state") -> None:
    """Equal tensors (same values, dtype and shape) and equal plain values, all the way down."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _round_trip(role, build) -> tuple[dict, dict]:
    """Play k steps of the job, then save, rebuild, load and save again."""
    role.run()
    saved = role.state_dict()
    fresh = build()
    fresh.load_state_dict(saved)
    return saved, fresh.state_dict()


def run_job(tmp_path: Path, strategy: str, **fields) -> dict[int, tuple]:
    config = make_config({"strategy": strategy, "workers": 2, "epochs": 1, "dataset": "digits",
                          "steps_per_epoch": STEPS, "out": str(tmp_path), **fields})
    return {rank: (role, *states)
            for rank, (role, states) in play_ranks(tmp_path, config, _round_trip).items()}


def check_round_trip(got: dict) -> tuple[list[dict], list[dict]]:
    """Every rank's state loads into a fresh role as it was; (servers', workers') states."""
    for rank, (_, saved, loaded) in got.items():
        assert_same(saved, loaded, f"rank {rank}")
    servers = [saved for role, saved, _ in got.values() if role == "server"]
    workers = [saved for role, saved, _ in got.values() if role == "worker"]
    for w in workers:
        assert w["position"] == {"epoch": 1, "step": 0, "taken": STEPS}
        assert w["model"].keys() and all(isinstance(t, torch.Tensor)
                                         for t in w["model"].values())
    return servers, workers


def bucket(server: dict) -> dict:
    (only,) = server["buckets"].values()
    return only


def test_bsp_state_round_trip(tmp_path):
    (server,), workers = check_round_trip(run_job(tmp_path, "bsp"))
    b = bucket(server)
    assert b["version"] == STEPS and b["progress"] == pytest.approx(STEPS)
    assert b["policy"]["clocks"] == {0: STEPS, 1: STEPS} and b["policy"]["active"] == []
    assert b["optimizer"]["momentum_buffer"].abs().max() > 0
    assert b["pending"].dtype == torch.float64 and b["pending_weight"] == 0.0
    for w in workers:
        assert w["strategy"]["link"]["pulled"] == [STEPS]
        assert w["strategy"]["cadence"]["pushes"] == STEPS


def test_asp_state_round_trip(tmp_path):
    (server,), _ = check_round_trip(run_job(tmp_path, "asp"))
    assert bucket(server)["version"] == 2 * STEPS  # every push an update


def test_easgd_state_round_trip(tmp_path):
    (server,), workers = check_round_trip(run_job(tmp_path, "easgd", tau=2))
    # Exchanges after steps 2 and 4, and one for the last step: 3 per worker.
    assert bucket(server)["version"] == 2 * 3
    assert bucket(server)["optimizer"] is None  # the centre is added to, not stepped
    for w in workers:
        assert w["strategy"]["cadence"] == {"steps": STEPS}
        assert w["strategy"]["optimizer"]["momentum_buffer"].abs().max() > 0


def test_downpour_state_round_trip(tmp_path):
    (server,), workers = check_round_trip(run_job(tmp_path, "downpour", push_every=2,
                                                  fetch_every=3))
    for w in workers:
        cadence = w["strategy"]["cadence"]
        assert cadence["push"] == cadence["fetch"] == {"steps": STEPS}
        assert cadence["pushes"] == 3  # after steps 2 and 4, and the last step's gradient
        assert w["strategy"]["link"]["pulled"] != [0]  # fetched after step 3
    assert bucket(server)["version"] == 2 * 3


def test_localsgd_state_round_trip(tmp_path):
    servers, workers = check_round_trip(run_job(tmp_path, "localsgd", tau=2))
    assert servers == []
    models = [torch.cat([t.reshape(-1) for t in w["model"].values()]) for w in workers]
    assert torch.equal(models[0], models[1])  # averaged at the end: one consensus
    for w in workers:
        assert w["strategy"]["cadence"] == {"steps": STEPS}
        assert w["strategy"]["optimizer"]["momentum_buffer"].abs().max() > 0


def test_gossip_state_round_trip(tmp_path):
    servers, workers = check_round_trip(run_job(tmp_path, "gossip", gossip_p=0.6))
    assert servers == []
    alphas = [w["strategy"]["alpha"] for w in workers]
    assert math.isclose(sum(alphas), 1.0)  # every message merged: the weights are home
    for w in workers:
        assert w["strategy"]["cadence"]["rng"]["bit_generator"] == "PCG64"


class _WithBatchNorm(nn.Module):
    def __init__(self, shape, classes) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(math.prod(shape))
        self.head = nn.Linear(math.prod(shape), classes)

    def forward(self, x):
        return self.head(self.norm(x.flatten(1)))


def test_a_workers_state_holds_the_models_buffers(tmp_path):
    # Built in this process (building does no I/O): BatchNorm's running statistics are part
    # of the worker's state, and a trained-looking value survives the round trip.
    MODELS.register(ModelSpec("bn-toy", "a linear model behind BatchNorm",
                              builder=_WithBatchNorm))
    try:
        config = make_config({"strategy": "allreduce", "workers": 1, "model": "bn-toy",
                              "dataset": "digits", "out": str(tmp_path)})
        ctx = RankContext(config, 0, Topology(0, 1), Transport())
        source = open_source(config.data, config.seed)
        plan = plan_data(config, source)
        worker = build_role(ctx, plan, source)
        worker.model.norm.running_mean.fill_(0.5)
        state = worker.state_dict()
        assert {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"} <= set(
            state["model"])
        fresh = build_role(ctx, plan, source)
        fresh.load_state_dict(state)
        assert torch.equal(fresh.model.norm.running_mean, torch.full((64,), 0.5))
        assert_same(fresh.state_dict(), state)
    finally:
        MODELS.unregister("bn-toy")
