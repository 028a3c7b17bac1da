"""Strategy-Switch in real jobs: the handover loses nothing, the rules fire where they say, and
the flags reach the right half."""

from __future__ import annotations

import re

import pytest
import torch

import polyrhythm
from helpers import (
    equivalence_config,
    max_diff,
    play_ranks,
    reference_parameters,
    stored_parameters,
)
from polyrhythm.cli.train import switch_line
from polyrhythm.comm.messages import REPLY_HEADER
from polyrhythm.config import make_config
from polyrhythm.errors import ConfigError
from polyrhythm.metrics.store import RunStore
from polyrhythm.runtime.server.server import ParameterServerShard
from polyrhythm.strategies.switching import loss_change

STEPS = 5


def _up_to_the_switch(role, build) -> dict:
    """Workers train one epoch of two (rule at, α = 0.5: the switch follows it) and stop;
    servers take the handover and stop."""
    if isinstance(role, ParameterServerShard):
        role.receive_handover()
        return role.state_dict()
    role.strategy.start()
    record = role.train_epoch(0)
    return {"record": record, "weights": role.flat.data.clone(),
            "momentum": role.strategy.first.optimizer.buffer.clone(),
            "phase": role.strategy.current is role.strategy.second}


def test_the_servers_start_exactly_where_the_workers_were(tmp_path):
    config = make_config({"strategy": "switch", "at": 0.5, "workers": 2, "servers": 2,
                          "epochs": 2, "dataset": "digits", "steps_per_epoch": STEPS,
                          "out": str(tmp_path)})
    got = play_ranks(tmp_path, config, _up_to_the_switch)
    servers = [state for role, state in got.values() if role == "server"]
    first, second = (state for role, state in got.values() if role == "worker")
    assert first["phase"] and second["phase"]  # both switched, after the same epoch
    assert first["record"]["rule_fired"] and first["record"]["phase"] == "allreduce"
    # The workers' replicas agree (all-reduce), and are not where they started.
    assert torch.equal(first["weights"], second["weights"])
    assert torch.equal(first["momentum"], second["momentum"])
    assert first["momentum"].abs().max() > 0
    buckets = [b for s in servers for b in s["buckets"].values()]
    weights = torch.cat([b["outbox"][REPLY_HEADER:] for b in buckets])
    momentum = torch.cat([b["optimizer"]["momentum_buffer"] for b in buckets])
    assert len(buckets) == 2 and weights.shape == first["weights"].shape
    assert torch.equal(weights, first["weights"])
    assert torch.equal(momentum, first["momentum"])
    for b in buckets:  # versions and the lr schedule go on from the steps taken
        assert b["version"] == STEPS and b["progress"] == STEPS
        assert b["outbox"][0] == b["outbox"][2] == STEPS and b["pending_weight"] == 0.0
        assert b["pending"].abs().max() == 0


def test_switching_to_bsp_ends_where_allreduce_ends(tmp_path):
    # Switched after epoch 1 of 2, with the lr halved each epoch (equivalence_config): bsp
    # takes the same steps as all-reduce only if parameters, momentum, and the lr schedule's
    # epoch all carried over.
    switch = polyrhythm.train(equivalence_config(tmp_path, strategy="switch", to="bsp",
                                                 at=0.5, workers=2))
    allreduce = polyrhythm.train(equivalence_config(tmp_path, strategy="allreduce", workers=2))
    assert switch["switch_epoch"] == 1 and switch["weight_updates"] == 20
    assert switch["phase_s"].keys() == {"allreduce", "bsp"}
    assert max_diff(stored_parameters(switch), stored_parameters(allreduce)) <= 1e-4
    # Never switched (⌊1.0 · 2⌋ epochs is the whole run): the servers still end with the
    # model, exactly all-reduce's.
    stay = polyrhythm.train(equivalence_config(tmp_path, strategy="switch", at=1.0, workers=2))
    assert stay["switch_epoch"] is None and stay["switch_s"] is None
    assert max_diff(stored_parameters(stay), stored_parameters(allreduce)) == 0


def test_a_switch_that_lost_worker_0_before_it_is_handed_over_by_worker_1(tmp_path):
    """on_worker_failure = continue, 3 workers; worker 0 dies after its step 4, in the
    all-reduce half: the others sum on over themselves, worker 1 (the first left) hands the
    model to the servers at the switch, and bsp goes on without worker 0. The parameters are
    a reference's that took worker 0's gradients for 4 steps and the others' after (the
    learning rate by epoch: the handover's step count carries bsp's progress on from it)."""
    config = equivalence_config(tmp_path, strategy="switch", to="bsp", at=0.5, workers=3,
                                batch_size=64, on_worker_failure="continue",
                                dies_after_steps=[4, 0, 0])
    summary = polyrhythm.train(config)
    assert summary["switch_epoch"] == 1
    assert [lost["worker"] for lost in summary["lost_workers"]] == [0]
    stored = stored_parameters(summary)
    assert max_diff(stored, reference_parameters(config, leaves={0: 4},
                                                 lr_by_epoch=True)) <= 1e-5
    assert max_diff(stored, reference_parameters(config, lr_by_epoch=True)) > 20 * 1e-5


def test_the_empirical_switch_epoch_follows_from_the_stored_losses(tmp_path):
    window, threshold = 2, 15.0
    summary = polyrhythm.train(equivalence_config(
        tmp_path, strategy="switch", rule="empirical", window=window,
        loss_threshold=threshold, workers=2, epochs=6, lr_decay_every=0))
    epochs = RunStore(tmp_path / "runs" / "polyrhythm.db").epochs(summary["run_id"])
    losses = [e["val_loss"] for e in epochs]
    fires = [k for k in range(1, len(epochs))  # k epochs done; none after the last
             if (s := loss_change(losses[:k], window)) is not None and s < threshold]
    assert summary["switch_epoch"] == (fires[0] if fires else None)
    done = summary["switch_epoch"] or len(epochs) - 1
    for k, e in enumerate(epochs[:done], start=1):  # the rule's stored score is its own
        s = loss_change(losses[:k], window)
        assert e["rule_score"] == pytest.approx(s) if s is not None else e["rule_score"] is None
        assert e["rule_fired"] == (k == summary["switch_epoch"])
    assert [e["phase"] for e in epochs] == ["allreduce"] * done + ["asp"] * (len(epochs) - done)


@pytest.mark.parametrize(("threshold", "switched"), [(1e-6, True), (1 - 1e-6, False)])
def test_the_straggler_rule_compares_the_measured_idleness(tmp_path, threshold, switched):
    # Idleness is timing, so only its extremes are certain: some waiting in every all-reduce
    # epoch, never all of it.
    summary = polyrhythm.train(equivalence_config(
        tmp_path, strategy="switch", rule="straggler", idleness_threshold=threshold,
        workers=2, epochs=2))
    assert summary["switch_epoch"] == (1 if switched else None)
    (first, _) = RunStore(tmp_path / "runs" / "polyrhythm.db").epochs(summary["run_id"])
    assert 0 < first["rule_score"] < 1 and bool(first["rule_fired"]) == switched
    if switched:
        assert 0 < summary["switch_s"] < summary["wall_s"]


def test_a_halfs_flags_reach_that_half():
    config = make_config({"strategy": "switch", "from": "ring", "to": "ssp", "staleness": 2,
                          "workers": 2})
    assert config.strategy["from"].name == "ring"
    assert (config.strategy.to.name, config.strategy.to.staleness) == ("ssp", 2)
    assert config.bucket_kb is not None  # ssp without a value bound decides per bucket
    whole = make_config({"strategy": "switch", "to": "kbsp", "quorum": 1, "workers": 2})
    assert whole.strategy.to.quorum == 1 and whole.bucket_kb is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"from": "bsp"}, "switch's from must be a collective strategy (allreduce, ring, "),
    ({"to": "localsgd"}, "switch's to must be a parameter-server strategy, got 'localsgd'"),
    ({"tau": 2}, "strategy 'switch' takes no --tau"),
    ({"rule": "sometimes"}, "rule must be one of at, empirical, straggler"),
    ({"idleness_threshold": 1.0}, "idleness_threshold must be in (0, 1)"),
    ({"to": {"name": "ssp", "staleness": 1}, "staleness": 2},
     "staleness is given twice (flat and in [strategy.to])"),
])
def test_bad_switch_settings_are_one_line_errors(fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config({"strategy": "switch", "workers": 2, **fields})


def test_a_switch_before_any_epoch_of_its_first_half_is_refused_before_anything_starts(
        tmp_path):
    """⌊0.3 · 3⌋ = 0: ring would never run. Refused, with the epochs that would do; α = 0
    (before training) and α = 1 (never) keep their meaning, and more epochs make 0.3 fine."""
    fields = {"strategy": "switch", "from": "ring", "to": "ssp", "staleness": 2, "at": 0.3,
              "out": str(tmp_path / "runs")}
    with pytest.raises(ConfigError, match=re.escape(
            "switch at 0.3 of 3 epochs is after ⌊0.9⌋ = 0 epochs, so ring would never run: "
            "give at least 4 epochs or a larger --at")):
        polyrhythm.train(fields)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match=re.escape("give at least 2 epochs (--at 0")):
        make_config({**fields, "at": 0.9, "epochs": 1})  # no α < 1 helps one epoch
    with pytest.raises(ConfigError, match=re.escape("give at least 1000 epochs or")):
        make_config({**fields, "at": 0.001, "epochs": 999})
    assert make_config({**fields, "epochs": 4}).strategy.at == 0.3  # ⌊1.2⌋ = 1
    for alpha in (0.0, 1.0):
        assert make_config({**fields, "at": alpha}).strategy.at == alpha
    assert make_config({**fields, "rule": "empirical"}).strategy.rule == "empirical"


def test_train_prints_when_and_why_it_switched():
    switched = {"switch_rule": "empirical", "switch_epoch": 11, "switch_s": 0.0808,
                "switch_why": "loss change s = 0.413 % < 1 %",
                "phase_s": {"allreduce": 40.86, "asp": 1.43}}
    assert switch_line(switched) == (
        "switched allreduce -> asp after epoch 11 (rule empirical: loss change s = 0.413 % "
        "< 1 %) in 0.081 s; allreduce 40.9 s, asp 1.4 s")
    stayed = {**switched, "switch_epoch": None, "switch_s": None,
              "switch_why": "loss change s = 1.305 % >= 1 %",
              "phase_s": {"allreduce": 42.3, "asp": 0.0}}
    assert switch_line(stayed) == ("never switched (rule empirical: loss change s = 1.305 % "
                                   ">= 1 %); allreduce 42.3 s, asp 0.0 s")


def _adam_up_to_the_switch(role, build) -> dict:
    if isinstance(role, ParameterServerShard):
        role.receive_handover()
        return role.state_dict()
    role.strategy.start()
    role.train_epoch(0)
    return {"weights": role.flat.data.clone(),
            "optimizer": role.strategy.first.optimizer.state_dict()}


def test_the_servers_take_over_adams_whole_state(tmp_path):
    config = make_config({"strategy": "switch", "at": 0.5, "workers": 2, "servers": 2,
                          "epochs": 2, "dataset": "digits", "steps_per_epoch": STEPS,
                          "out": str(tmp_path), "optimizer": "adam", "lr": 0.003})
    got = play_ranks(tmp_path, config, _adam_up_to_the_switch)
    servers = [state for role, state in got.values() if role == "server"]
    first, _ = (state for role, state in got.values() if role == "worker")
    buckets = [b for s in servers for b in s["buckets"].values()]
    assert torch.equal(torch.cat([b["outbox"][REPLY_HEADER:] for b in buckets]),
                       first["weights"])
    for key in ("exp_avg", "exp_avg_sq"):  # each bucket its slice, bit for bit
        assert first["optimizer"][key].abs().max() > 0
        assert torch.equal(torch.cat([b["optimizer"][key] for b in buckets]),
                           first["optimizer"][key])
    assert [float(b["optimizer"]["step"]) for b in buckets] == [STEPS, STEPS]


def test_switching_to_bsp_with_adamw_ends_where_allreduce_ends(tmp_path):
    # Adam's moments and step count carried over: bsp's steps after the switch are
    # all-reduce's (a server starting Adam afresh would take other steps: bias correction).
    adamw = {"optimizer": "adamw", "lr": 0.003, "workers": 2}
    switch = polyrhythm.train(equivalence_config(tmp_path, strategy="switch", to="bsp",
                                                 at=0.5, **adamw))
    allreduce = polyrhythm.train(equivalence_config(tmp_path, strategy="allreduce", **adamw))
    assert switch["switch_epoch"] == 1 and switch["weight_updates"] == 20
    assert max_diff(stored_parameters(switch), stored_parameters(allreduce)) <= 1e-5
