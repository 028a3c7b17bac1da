"""Strategies trained for real on mnist5k, in separate processes."""

import pytest

import polyrhythm
from helpers import flat, small_config, stored_parameters
from polyrhythm.comm.messages import PUSH_HEADER
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RunStore
from polyrhythm.models.build import build_model
from polyrhythm.runtime.job import whole_data
from polyrhythm.strategies import STRATEGIES


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
    # Worker 0 computes 40 ms slower per step. Unbounded, the others race ahead of it (21
    # clocks of 25 with staleness = 1000 here); with s = 1 a worker is released after its
    # push c only while c - s <= the slowest clock, so its push c + 1 reaches the server
    # only once every other worker has pushed c - s: no worker's clock may ever lead
    # another's by more than s + 1 in the order the server received them. That holds (and
    # is read from the server's record of every push) however the machine schedules them.
    steps, s, workers = 25, 1, 3
    summary = polyrhythm.train(strategy="ssp", staleness=s, workers=workers, epochs=1,
                               steps_per_epoch=steps, worker_delay_s=[0.04, 0, 0],
                               out=str(tmp_path))
    pushes = RunStore(tmp_path / STORE_NAME).series("pushes", summary["run_id"])
    clocks, lead = [0] * workers, 0
    for push in pushes:  # as the server received them
        clocks[push["worker"]] += 1
        lead = max(lead, max(clocks) - min(clocks))
    assert clocks == [steps] * workers and summary["weight_updates"] == workers * steps
    assert [w["steps"] for w in summary["per_worker"]] == [steps] * workers
    assert lead <= s + 1, f"a worker ran {lead} clocks ahead of another"
    # Between a worker's release after its push c and its push c + 1, each other worker goes
    # from a clock >= c - s to at most c + s + 1: at most 2s + 1 updates each, so every
    # gradient is at most (N - 1)(2s + 1) updates stale.
    assert max(p["staleness"] for p in pushes) == summary["staleness_max"]
    assert summary["staleness_max"] <= (workers - 1) * (2 * s + 1)


@pytest.mark.parametrize("strategy", ["kbsp", "backup"])
def test_quorum_rounds_cancel_a_straggler_and_end_with_the_rounds(tmp_path, strategy):
    # Worker 3 computes 1 s slower per step. Rounds close without it (its gradients are
    # always stale, so dropped); once the run's rounds are done the servers end training and
    # it stops, rather than going on alone with rounds of one gradient at the full lr. (At
    # 100 ms it was no straggler on a machine loaded enough to stretch the others' steps to
    # as much: it took 19 of the 30 steps.)
    steps, delay = 30, 1.0
    summary = polyrhythm.train(strategy=strategy, workers=4, epochs=1, steps_per_epoch=steps,
                               worker_delay_s=[0, 0, 0, delay], out=str(tmp_path))
    *fast, slow = summary["per_worker"]
    assert summary["weight_updates"] == steps
    assert [w["steps"] for w in fast] == [steps] * 3
    # It stopped when the rounds were done, not after its own 30 steps (alone, at the full
    # lr). Its steps say so whatever the machine's load; the wall time does not.
    assert slow["steps"] < steps / 2
    # The model stored is the one the first worker pulled last: no update came after it.
    (last,) = summary["epoch_metrics"]
    assert summary["final_val_accuracy"] == last["val_accuracy"]
    assert summary["final_val_loss"] == pytest.approx(last["val_loss"], rel=1e-6)


STEPS = 70  # mnist5k: 4,500 training samples in global batches of 64

# Every strategy trains the default cnn on mnist5k with 4 workers to >= 0.85 within 5 epochs.
# (strategy, extra config, epochs): the fewest epochs that reach it with a margin here.
TRAINED = [
    ("ssp", {"value_bound": 0.05}, 2),
    ("kbsp", {}, 3),
    ("kasp", {}, 2),
    ("backup", {}, 3),
    ("softsync", {}, 2),
    ("downpour", {"push_every": 2, "fetch_every": 2}, 2),
    ("easgd", {}, 2),
    ("dcasgd", {}, 2),
    ("allreduce", {}, 2),
    ("ring", {}, 2),
    ("tree", {}, 2),
    ("reduce-broadcast", {}, 2),
]


@pytest.mark.parametrize(("strategy", "extra", "epochs"), TRAINED,
                         ids=[name for name, _, _ in TRAINED])
def test_strategy_trains_mnist5k_with_4_workers(tmp_path, strategy, extra, epochs):
    summary = polyrhythm.train(strategy=strategy, workers=4, epochs=epochs, out=str(tmp_path),
                               **extra)
    assert summary["final_val_accuracy"] >= 0.85, summary["final_val_accuracy"]
    pushes = 4 * STEPS * epochs
    updates = summary["weight_updates"]
    if strategy in ("kbsp", "backup"):  # every applied gradient fresh; late ones dropped
        assert summary["staleness_max"] == 0
        assert updates == STEPS * epochs  # as many rounds as BSP, then the servers end it
    elif strategy == "kasp":  # N/k updates per round, all gradients used (k = N/2 = 2)
        assert pushes // 2 <= updates <= pushes // 2 + STEPS * epochs
        assert summary["staleness_max"] > 0
    elif strategy == "downpour":  # one push per 2 steps, each its own update
        assert updates == pushes // 2
    elif strategy == "easgd":  # one elastic exchange per tau = 4 steps
        assert updates == pushes // 4
    elif strategy == "dcasgd":  # asp's updates, each stale push compensated
        assert updates == pushes and summary["staleness_max"] > 0
    elif strategy == "softsync":  # asynchronous, momentum corrected as for ASP
        assert updates == pushes
        assert summary["server_momentum"] == pytest.approx(0.15)


def test_downpour_pushes_and_fetches_on_their_own_schedules(tmp_path):
    # 2 workers x 18 steps, push every 2 (9 pushes each), fetch every 3 (6 fetches each).
    summary = polyrhythm.train(small_config(tmp_path, strategy="downpour", workers=2,
                                            steps_per_epoch=9, push_every=2, fetch_every=3))
    assert summary["weight_updates"] == 2 * 9  # every push is its own update
    push = 4 * (PUSH_HEADER + summary["parameters"])
    server, *workers = summary["traffic_per_rank"]
    for w in workers:
        # pushes (one of which also fetches), fetch-only messages, and the final DONE
        fetch_only = 6 - 3  # steps 3, 9, 15 fetch without pushing; 6, 12, 18 push and fetch
        assert w["messages_sent"] == 9 + fetch_only + 1
        assert w["bytes_sent"] == (9 + fetch_only + 1) * push
        assert w["messages_received"] == 6
    assert server["messages_sent"] == 2 * 6


def test_every_registered_strategy_has_a_training_test():
    # bsp and asp: test_asp_makes_n_times_the_updates_of_bsp_and_still_learns;
    # localsgd, dpsgd, gossip: tests/test_decentralised.py; switch: tests/test_switch.py.
    # tree-easgd: test_tree_easgd.py.
    # mapreduce (Spark's jobs, not a script's loop): tests/test_mapreduce.py.
    elsewhere = {"bsp", "asp", "localsgd", "dpsgd", "gossip", "tree-easgd", "switch",
                 "mapreduce"}
    assert set(STRATEGIES) == {name for name, _, _ in TRAINED} | elsewhere


@pytest.mark.parametrize(("strategy", "extra"), [("downpour", {"push_every": 5}),
                                                  ("easgd", {"tau": 5})])
def test_gradients_of_the_last_steps_reach_the_servers(tmp_path, strategy, extra):
    # 3 steps, fewer than one push or exchange period: finish() sends what is left, so the
    # stored model is not the initial one.
    config = small_config(tmp_path, strategy=strategy, workers=2, epochs=1,
                          steps_per_epoch=3, **extra)
    summary = polyrhythm.train(config)
    assert summary["weight_updates"] == 2  # one per worker, at the end
    _, train, _ = whole_data(config)
    initial = flat(build_model(config.model, train.shape, train.classes, config.seed)
                   .state_dict())
    assert (stored_parameters(summary) - initial).abs().max() > 1e-3
