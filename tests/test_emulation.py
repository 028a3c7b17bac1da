"""Emulation without namespaces: its settings, units, the transport's latency, emulated
compute, host placement and the fidelity guard's verdict."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import namedtuple

import pytest
import torch
from torch import nn

import polyrhythm
from helpers import small_config
from polyrhythm.comm.delay import DelayLine
from polyrhythm.config import make_config
from polyrhythm.config.emulation import host_ranks
from polyrhythm.errors import ConfigError
from polyrhythm.launch.cluster.fidelity import FidelityGuard
from polyrhythm.metrics.store import RunStore
from polyrhythm.models.build import build_model
from polyrhythm.runtime.worker.compute import EmulatedForward, emulated_step
from polyrhythm.units import Delay, duration, rate


def test_units_read_durations_and_tc_rates_and_refuse_byte_rates():
    assert duration("120ms") == pytest.approx(0.12)
    assert duration("1.5s") == 1.5 and duration("250us") == pytest.approx(250e-6)
    assert rate("100mbit") == 1e8 and rate("1gbit") == 1e9 and rate("2.5kbit") == 2500
    for bad in ("100mbps", "fast", "0mbit", "-3mbit"):
        with pytest.raises(ConfigError, match="rate such as 100mbit"):
            rate(bad)
    with pytest.raises(ConfigError, match="duration such as 120ms"):
        duration("120")


@pytest.mark.parametrize("distribution", ["normal", "uniform", "exponential"])
def test_delays_repeat_by_seed_and_keep_their_mean(distribution):
    delay = Delay(0.1, 0.02, distribution)
    a, b = delay.sampler(3), delay.sampler(3)
    draws = [a() for _ in range(4000)]
    assert draws[:50] == [b() for _ in range(50)]
    assert min(draws) >= 0
    mean = sum(draws) / len(draws)
    assert mean == pytest.approx(0.12 if distribution == "exponential" else 0.1, rel=0.03)


@pytest.mark.parametrize(("fields", "error"), [
    ({"bandwidth": "100mbit"}, "--bandwidth is for an emulated cluster"),
    ({"cpu": [0.5]}, "--cpu is for an emulated cluster"),
    ({"hosts": 2, "workers": 2, "servers": 2}, "needs at least 3 hosts"),
    ({"hosts": 4, "workers": 2, "strategy": "allreduce"}, "4 worker hosts for 2 workers"),
    ({"hosts": 3, "workers": 3, "strategy": "ring", "placement": "collocated"},
     "placement is for strategies with servers"),
    ({"hosts": 3, "workers": 4, "bandwidth": ["1gbit", "1gbit"]},
     r"bandwidth needs one value, or one per host \(3\), got 2"),
    ({"hosts": 3, "workers_per_host": 1, "workers": 4}, "does not match workers_per_host"),
    ({"hosts": 2, "cpu": [0.0]}, "cpu must have entries from 0.01 to 1024"),
    ({"latency": "20"}, "latency must be a duration"),
    ({"compute": "emulated"}, "needs one of --compute-time"),
    ({"compute": "emulated", "compute_time": "1ms", "compute_from": "x"}, "not both"),
    ({"compute_time": "10ms"}, "compute_time is for emulated compute"),
    ({"compute": "guessed"}, "compute must be one of real, emulated"),
])
def test_emulation_settings_are_checked_in_one_line(tmp_path, fields, error):
    with pytest.raises(ConfigError, match=error):
        small_config(tmp_path, **fields)


def test_hosts_follow_workers_per_host_and_servers_follow_collocated_hosts():
    dedicated = make_config({"strategy": "bsp", "workers": 4, "workers_per_host": 1})
    assert (dedicated.servers, dedicated.cluster.hosts) == (1, 5)
    assert host_ranks(dedicated.cluster, 1, 4) == [[0], [1], [2], [3], [4]]
    collocated = make_config({"strategy": "bsp", "workers": 4, "workers_per_host": 2,
                              "placement": "collocated"})
    assert (collocated.servers, collocated.cluster.hosts) == (2, 2)
    assert host_ranks(collocated.cluster, 2, 4) == [[0, 2, 3], [1, 4, 5]]
    ring = make_config({"strategy": "ring", "workers": 5, "hosts": 2})
    assert host_ranks(ring.cluster, 0, 5) == [[0, 1, 2], [3, 4]]
    local = make_config({"workers": 2})
    assert host_ranks(local.cluster, 1, 2) == [[0, 1, 2]]


def test_a_config_that_emulates_nothing_writes_no_emulation_settings():
    assert "cluster" not in make_config({}).to_dict()
    assert "compute" not in make_config({}).to_dict()
    emulated = make_config({"hosts": 2, "latency": "5ms", "compute": "emulated",
                            "compute_time": "10ms"})
    assert emulated.to_dict()["cluster"] == {
        "hosts": 2, "placement": "dedicated", "bandwidth": [], "cpu": [], "latency": "5ms",
        "latency_jitter": "0ms"}
    assert make_config({"latency": "5ms"}).to_dict()["cluster"] == {"latency": "5ms"}
    ring = make_config({"strategy": "ring", "workers": 2, "hosts": 2})
    assert "placement" not in ring.to_dict()["cluster"]  # no servers to place
    assert make_config(emulated.to_dict()) == emulated


class FakeWork:
    def __init__(self, log, tensor, dst, tag):
        log.append((time.monotonic(), tensor.item(), dst, tag))

    def is_completed(self):
        return True

    def wait(self):
        return True


def test_delay_line_holds_each_send_and_keeps_order_per_peer_and_tag():
    log: list = []
    jitter = iter([0.08, 0.0, 0.05, 0.0, 0.0, 0.0] * 10)
    line = DelayLine(lambda: 0.02 + next(jitter),
                     post=lambda t, dst, tag: FakeWork(log, t, dst, tag))
    sent = []
    for i in range(6):
        buffer = torch.tensor([float(i)])
        sent.append(time.monotonic())
        line.send(buffer, dst=i % 2, tag=7)
        buffer.fill_(-1.0)  # the caller may reuse its buffer at once: a copy went out
    line.drain()
    assert sorted(value for _, value, _, _ in log) == [0, 1, 2, 3, 4, 5]
    for dst in (0, 1):
        values = [v for _, v, d, _ in log if d == dst]
        assert values == sorted(values)  # jitter never reorders a peer's messages
    for posted, value, _, _ in log:
        assert posted - sent[int(value)] >= 0.02


def test_latency_is_paid_by_every_push_and_reply(tmp_path):
    # bsp with one worker: per step a push and a reply, each held 40 ms; compute is 10 ms.
    config = small_config(tmp_path, strategy="bsp", workers=1, epochs=1, steps_per_epoch=8,
                          warmup_steps=2, compute="emulated", compute_time="10ms",
                          latency="40ms")
    summary = polyrhythm.train(config)
    rows = RunStore(tmp_path / "runs" / "polyrhythm.db").series("iterations",
                                                                summary["run_id"])
    assert len(rows) == 8
    assert min(r["total_s"] for r in rows) >= 0.010 + 2 * 0.040


def test_emulated_step_sleeps_and_leaves_zero_gradients_through_the_hooks():
    model = build_model("cnn", (1, 28, 28), 10, 0)
    fired = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda param: fired.append(param.numel()))
    began = time.perf_counter()
    loss = emulated_step(model, 0.05)
    assert time.perf_counter() - began >= 0.05 and math.isnan(loss)
    assert sorted(fired) == sorted(p.numel() for p in model.parameters())
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_a_scripts_emulated_forward_learns_each_shape_once_and_leaves_no_trace():
    """Three steps of two forwards each (gradient accumulation), on two input shapes: one
    real forward per shape, whose BatchNorm statistics and dropout draws are put back; one
    compute time drawn a step, none under no_grad; zero outputs, zero gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    real = []
    model[0].register_forward_hook(lambda module, inputs, out: real.append(inputs[0].shape))
    statistics = [b.clone() for b in model.buffers()]
    taken, drawn = [0], []
    model.forward = EmulatedForward(model, lambda: drawn.append(taken[0]) or 0.0,
                                    lambda: taken[0])
    inputs = torch.randn(8, 4), torch.randn(5, 4)
    random_state = torch.get_rng_state()
    for _ in range(3):
        for x in inputs:
            out = model(x)
            assert out.shape == (len(x), 3) and not out.any()
            (out - 1).pow(2).sum().backward()  # a loss whose gradient at zero is not zero
        taken[0] += 1
    with torch.no_grad():
        assert not model(inputs[0]).requires_grad
    assert real == [(8, 4), (5, 4)] and drawn == [0, 1, 2]
    assert torch.equal(torch.get_rng_state(), random_state)
    buffers = zip(model.buffers(), statistics, strict=True)
    assert all(torch.equal(b, before) for b, before in buffers)
    assert all(p.grad.shape == p.shape and not p.grad.any() for p in model.parameters())


Pair = namedtuple("Pair", "logits rest")


class Heads(nn.Module):
    """Logits, the classes they pick and an absent extra, in a dict of a namedtuple; or,
    with `label`, a string beside them."""

    def __init__(self, label: bool = False) -> None:
        super().__init__()
        self.linear, self.label = nn.Linear(4, 2), label

    def forward(self, x):
        logits = self.linear(x)
        if self.label:
            return logits, "two classes"
        return {"pair": Pair(logits, [logits.argmax(1), None])}


def test_emulated_forward_keeps_the_outputs_structure_and_names_what_it_cannot_make():
    model = Heads()
    model.forward = EmulatedForward(model, lambda: 0.0, lambda: 0)
    out = model(torch.randn(3, 4))["pair"]
    assert isinstance(out, Pair) and out.logits.shape == (3, 2) and out.logits.requires_grad
    picked, absent = out.rest
    assert picked.dtype == torch.int64 and picked.shape == (3,) and not picked.requires_grad
    assert absent is None
    labelled = Heads(label=True)
    labelled.forward = EmulatedForward(labelled, lambda: 0.0, lambda: 0)
    with pytest.raises(ConfigError, match=r"^emulated compute stands in for Heads's output "
                       r".* not the str at output\[1\]: run this model with --compute real$"):
        labelled(torch.randn(3, 4))


def test_emulated_compute_moves_the_real_traffic_and_replays_a_stored_run(tmp_path):
    real = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2, epochs=1))
    replay = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2, epochs=1,
                                           compute="emulated", compute_from=real["run_id"]))
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    for key in ("bytes_sent", "messages_sent"):
        assert ([r[key] for r in replay["traffic_per_rank"]]
                == [r[key] for r in real["traffic_per_rank"]])
    measured = {(r["worker"], r["step"]): r["compute_s"]
                for r in store.series("iterations", real["run_id"])}
    for row in store.series("iterations", replay["run_id"]):
        assert row["compute_s"] >= measured[row["worker"], row["step"]]
    assert math.isnan(replay["epoch_metrics"][0]["train_loss"])


def test_compute_from_an_unknown_or_uninstrumented_run_is_one_clear_error(tmp_path):
    with pytest.raises(polyrhythm.PolyrhythmError, match="no run 'nope'"):
        polyrhythm.train(small_config(tmp_path, compute="emulated", compute_from="nope"))
    quiet = polyrhythm.train(small_config(tmp_path, workers=1, epochs=1,
                                          instrumentation=False))
    with pytest.raises(polyrhythm.PolyrhythmError, match="instrumentation off"):
        polyrhythm.train(small_config(tmp_path, compute="emulated",
                                      compute_from=quiet["run_id"]))


def test_fidelity_guard_flags_a_host_starved_while_the_machine_was_saturated():
    guard = FidelityGuard([list, list], [1.0, None])
    saturated = [(1.0, [(0.4, 0.8), (1.9, 0.0)])] * 3   # host 0 wants CPU, gets 0.4 of 1.0
    idle = [(0.3, [(0.1, 0.0), (0.2, 0.0)])] * 7
    verdict = guard.verdict(saturated + idle)
    assert [h["starved_fraction"] for h in verdict["hosts"]] == [0.3, 0.0]
    assert verdict["emulator_bound"] and not verdict["hosts"][1]["emulator_bound"]
    assert not guard.verdict(idle)["emulator_bound"]
    # Throttled by its own quota (ran its share) is the emulation working, not a fault.
    assert not guard.verdict([(1.0, [(0.95, 0.9), (1.0, 0.0)])] * 5)["emulator_bound"]


def test_fidelity_guard_judges_the_training_window_only_and_nothing_without_samples():
    guard = FidelityGuard([list], [0.5]).start()
    guard.stop()
    guard.samples = [(10.0, 1.0, [(0.1, 0.5)]),    # starting up: saturated, starved
                     (10.5, 0.3, [(0.45, 0.0)]),   # training: fine
                     (11.0, 0.3, [(0.45, 0.0)]),
                     (11.5, 1.0, [(0.1, 0.5)])]    # the gather after training
    verdict = guard.verdict_over(10.2, 11.0)
    assert verdict["samples"] == 2 and verdict["emulator_bound"] is False
    assert guard.verdict_over(9.0, 12.0)["hosts"][0]["starved_fraction"] == 0.5
    unknown = guard.verdict_over(20.0, 21.0)
    assert unknown["samples"] == 0 and unknown["emulator_bound"] is None
    assert FidelityGuard([list], [64.0]).shares == [float(os.cpu_count() or 1)]


def test_a_send_made_while_another_is_posted_is_posted_once_as_is_the_other():
    # A is due at 30 ms and takes 50 ms to post; B's latency is drawn slowly (45 ms) and is
    # 0: B is made while A is being posted and is due before A was.
    log: list = []
    draws = iter([0.03, "slow zero"])

    def draw():
        value = next(draws)
        if value == "slow zero":
            time.sleep(0.045)
            return 0.0
        return value

    def slow_post(tensor, dst, tag):
        time.sleep(0.05)
        return FakeWork(log, tensor, dst, tag)

    line = DelayLine(draw, post=slow_post)
    line.send(torch.tensor([1.0]), dst=0, tag=0)
    line.send(torch.tensor([2.0]), dst=1, tag=0)
    line.drain()
    assert sorted((value, dst) for _, value, dst, _ in log) == [(1.0, 0), (2.0, 1)]


class HeldWork:
    """A send the receiver has not taken yet: complete once released."""

    released = threading.Event()

    def is_completed(self):
        return self.released.is_set()

    def wait(self):
        self.released.wait()
        return True


def test_a_destination_takes_a_window_of_messages_then_its_sender_waits():
    from polyrhythm.comm.delay import IN_FLIGHT

    line = DelayLine(lambda: 0.0, post=lambda t, dst, tag: HeldWork())
    for _ in range(IN_FLIGHT):
        line.send(torch.zeros(1), dst=3, tag=0)
    line.send(torch.zeros(1), dst=4, tag=0)  # another peer's window is its own
    blocked = threading.Thread(target=line.send, args=(torch.zeros(1), 3, 0))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()  # the link is full: the sender waits, as on a socket
    HeldWork.released.set()
    blocked.join(5)
    assert not blocked.is_alive()
    line.drain()


def test_a_slowed_worker_stretches_its_measured_compute(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="asp", workers=2, epochs=1,
                                            compute="emulated", compute_time="20ms",
                                            slowdown=[1.0, 3.0]))
    rows = RunStore(tmp_path / "runs" / "polyrhythm.db").series("iterations",
                                                                summary["run_id"])
    slowed = [r["compute_s"] for r in rows if r["worker"] == 1]
    assert len(slowed) == 10 and min(slowed) >= 3 * 0.020  # 20 ms, then twice that again
    with pytest.raises(ConfigError, match="slowdown must have entries of at least 1"):
        small_config(tmp_path, workers=2, slowdown=[0.5])
    with pytest.raises(ConfigError, match=r"slowdown needs one value per worker \(2\), got 3"):
        small_config(tmp_path, workers=2, slowdown=[1, 1, 3])
