"""The simulator under compression: its messages are the bytes a real run's traffic counters
count (a push, a reply, a ring's rounds), a calibration takes a run's encoding seconds, the
estimates follow the codecs' rules, and the advisor ranks strategy x compressor pairs and
flags a compressor by what the store's runs lost with it."""

from __future__ import annotations

import json
import math

import pytest

import polyrhythm
from helpers import small_config
from polyrhythm.compression.wire import (
    GATHER,
    all_reduce_parts,
    bucket_words,
    extent_of,
    kept,
    payload_words,
)
from polyrhythm.config import load_config, make_config
from polyrhythm.layout import GATHERS, SEND, BucketLayout
from polyrhythm.metrics.store import RunStore
from polyrhythm.sim import Costs, simulate
from polyrhythm.sim.calibrate import calibrate
from polyrhythm.sim.compressed import HEADER, REPLY_HEADER, codec_key, settings_key
from polyrhythm.sim.setup import setup, simulation_config
from test_advise import _stored
from test_compression_runs import CNN_SHAPES

STEPS = 20  # small_config's 2 epochs of 10


def on_hosts(cal):
    """The calibrated run's config with a host per rank, so every message crosses a link
    (on loopback the simulator's ranks share one host and move nothing)."""
    return simulation_config(cal.config.to_dict(), {"bandwidth": ["1gbit"]})


def test_a_simulated_bsp_top_k_run_sends_the_real_runs_pushes_and_replies(advise, tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2,
                                            compress="topk", ratio=0.01))
    cal = calibrate(tmp_path / "runs", summary["run_id"])
    assert cal.costs.shapes == [list(s) for s in CNN_SHAPES]
    result = simulate(on_hosts(cal), cal.costs, STEPS)
    server, *workers = summary["traffic_per_rank"]
    push = workers[0]["bytes_sent"] // workers[0]["messages_sent"]
    assert push == HEADER + 4 * 2 * kept(0.01, summary["parameters"])  # 2 % of the model
    for w, real in enumerate(workers, 1):  # host 0 is the server's
        # Each step's push as the real one; the simulator's leaving message is a header.
        assert result.sent[w] == STEPS * push + HEADER
        assert real["bytes_sent"] == (STEPS + 1) * push
    assert result.sent[0] == server["bytes_sent"] == 2 * STEPS * (
        REPLY_HEADER + 4 * summary["parameters"])  # dense replies
    # The advisor takes the run's encoding seconds for its compressor.
    run = advise("--hosts", "3", "--calibrate", summary["run_id"], "--compressors", "none",
                 "topk", "--out", str(tmp_path / "runs"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("compute and update cost, topk ratio=0.01 encoding seconds "
                                 f"of run {summary['run_id']}")


def test_a_calibration_takes_the_runs_encoding_seconds_and_replays_them(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2,
                                            compress="topk", ratio=0.05))
    out = tmp_path / "runs"
    cal = calibrate(out, summary["run_id"])
    store = RunStore(out / "polyrhythm.db")
    rows = [r for r in store.series("iterations", summary["run_id"])
            if r["step"] >= summary["warmup_steps"]]
    assert cal.costs.compressor == "topk ratio=0.05"
    assert cal.costs.compress_s == pytest.approx(sum(r["compress_s"] for r in rows) / len(rows))
    assert cal.costs.compress_s > 0  # encoding is measured, not zero
    pushes = len(store.series("pushes", summary["run_id"]))  # one bucket: a whole model each
    assert cal.costs.server_compress_s == pytest.approx(
        summary["compression"]["server_compress_s"] / pushes)
    # Replayed: a step that pushes takes the mean measured seconds; the same costs under
    # another compressor (not measured, not timed) take none.
    assert simulate(cal.config, cal.costs, STEPS).compress_s == pytest.approx(
        cal.costs.compress_s)
    other = make_config({**cal.config.to_dict(), "compression": {"name": "fp16"}})
    assert simulate(other, cal.costs, STEPS).compress_s == 0.0


@pytest.mark.parametrize("compressor", ["fp16", "powersgd"])
def test_a_simulated_compressed_ring_moves_what_the_real_ring_moves(tmp_path, compressor):
    n = 3
    summary = polyrhythm.train(small_config(tmp_path, strategy="ring", workers=n,
                                            batch_size=60, compress=compressor,
                                            **({"rank": 2} if compressor == "powersgd"
                                               else {})))
    cal = calibrate(tmp_path / "runs", summary["run_id"])
    result = simulate(on_hosts(cal), cal.costs, STEPS)
    traffic = summary["traffic_per_rank"]
    # Every simulated member sends member 0's rounds (the others' differ by a value a chunk).
    assert result.sent[0] == traffic[0]["bytes_sent"]
    for member, rank in enumerate(traffic):
        assert abs(result.sent[member] - rank["bytes_sent"]) <= STEPS * 2 * (n - 1) * 4 * 2
    if compressor == "powersgd":  # far below the dense ring's 2(N-1)/N of the model
        assert result.sent[0] < STEPS * 4 * summary["parameters"] / 10


@pytest.mark.parametrize("compressor", ["qsgd", "powersgd"])
def test_push_sizes_are_padded_to_their_servers_largest_and_replies_compressed_if_asked(
        compressor):
    costs = Costs(105_866, shapes=[list(s) for s in CNN_SHAPES])
    for replies in (False, True):
        config = load_config(strategy="bsp", servers=2, workers=2, bucket_kb=64,
                             compress=compressor, compress_replies=replies,
                             compute="emulated", compute_time="1ms")
        s = setup(config, costs, 1)
        layout = BucketLayout(costs.parameters, 2, 64).buckets
        pushes = bucket_words(config.compression, layout, CNN_SHAPES)
        for (server, a, b), (owner, size), reply in zip(layout, s.buckets, s.replies,
                                                        strict=True):
            largest = max(w for (t, _, _), w in zip(layout, pushes, strict=True) if t == server)
            assert owner == server and size == HEADER + 4 * largest
            words = payload_words(compressor, config.compression, extent_of(a, b, CNN_SHAPES))
            assert reply == REPLY_HEADER + 4 * (words if replies else b - a)
        if compressor == "powersgd":  # buckets cut the matrices: their messages differ
            assert len(set(pushes)) > 2


def test_a_gathered_compressor_moves_its_message_by_the_algorithms_all_gather():
    n, costs = 5, Costs(105_866, shapes=[list(s) for s in CNN_SHAPES])
    config = load_config(strategy="tree", workers=n, workers_per_host=1, bandwidth="1gbit",
                         compress="topk", compute="emulated", compute_time="1ms")
    ((kind, nbytes),) = all_reduce_parts("topk", config.compression,
                                         extent_of(0, costs.parameters, CNN_SHAPES))
    assert kind == GATHER
    words = nbytes // 4
    sends = [sum(op.numel for ops in GATHERS["tree"](n, i, words) for op in ops
                 if op.op == SEND) for i in range(n)]
    assert simulate(config, costs, 3).sent == [3 * 4 * s for s in sends]


def test_a_model_given_by_its_megabytes_has_no_matrices_so_powersgd_sends_it_whole():
    config = load_config(strategy="ring", workers=4, compress="powersgd", compute="emulated",
                         compute_time="1ms")
    parts = setup(config, Costs(1_000_000), 1).parts
    assert [(p.gather, p.values, p.value_bytes) for p in parts] == [(False, 1_000_000, 4)]
    shaped = setup(config, Costs(105_866, shapes=[list(s) for s in CNN_SHAPES]), 1).parts
    assert len(shaped) == 2 and sum(p.values for p in shaped) < 105_866 / 10


@pytest.mark.parametrize(("strategy", "fields", "per_step"), [
    # a push encodes, and with error feedback (top-k's default) decodes its message
    ("bsp", {}, lambda e, d, n: e + d),
    # a gathered all-reduce decodes every member's message, and its own for the residual
    ("ring", {}, lambda e, d, n: e + n * d + d),
    # local SGD encodes at its averages only: every tau steps
    ("localsgd", {"tau": 4}, lambda e, d, n: (e + n * d + d) / 4),
])
def test_compression_seconds_are_estimated_from_the_codecs_timed_encode_and_decode(
        strategy, fields, per_step):
    n, encode, decode = 4, 0.003, 0.001
    config = load_config(strategy=strategy, workers=n, workers_per_host=1, bandwidth="1gbit",
                         compress="topk", compute="emulated", compute_time="10ms",
                         warmup_steps=0, **fields)
    costs = Costs(100_000, codec_s={settings_key(config.compression): [encode, decode]})
    result = simulate(config, costs, 8)
    assert result.compress_s == pytest.approx(per_step(encode, decode, n))
    plain = simulate(config, Costs(100_000), 8)
    assert result.iteration_s > plain.iteration_s  # not overlapped with anything


def test_a_compressors_label_reads_alike_from_settings_and_stored_fields():
    config = load_config(compress="topk", ratio=0.05)
    assert settings_key(config.compression) == "topk ratio=0.05"
    assert codec_key("topk", {"compress": "topk", "ratio": 0.05}) == "topk ratio=0.05"
    assert codec_key("topk", {}) == "topk ratio=0.01"
    assert codec_key("qsgd", {"error_feedback": True}) == "qsgd levels=15 error_feedback=True"
    assert codec_key("none", {"ratio": 0.5}) == "none"


def test_advise_ranks_every_strategy_with_every_compressor(advise, tmp_path):
    run = advise("--hosts", "4", "--compute-time", "10ms", "--compressors", "none,fp16",
                 "topk", "--json", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[2].startswith("codecs timed here on one core")
    assert "fp16: " in lines[2] and "topk ratio=0.01: " in lines[2]
    ranked = json.loads(lines[-1])
    plain = [o["option"] for o in ranked if o["compress"] == "none"]
    assert len(ranked) == 3 * len(plain)
    for name in ("fp16", "topk"):
        assert sorted(o["option"] for o in ranked if o["compress"] == name) == sorted(
            f"{label} + {name}" for label in plain)
    for o in ranked:  # no stored run: a compressor's cost is unknown, and said so
        assert ("accuracy cost unknown" in o["flag"]) == (o["compress"] != "none")
        assert o["caution"] or o["compress"] == "none"


def test_advise_flags_a_compressor_whose_stored_runs_lost_accuracy(advise, tmp_path):
    _stored(tmp_path, "bsp-8", "bsp", 8, 0.93)
    _stored(tmp_path, "bsp-8-topk", "bsp", 8, 0.90, compress="topk")  # lost 3 points
    _stored(tmp_path, "bsp-8-fp16", "bsp", 8, 0.928, compress="fp16")  # lost 0.2
    _stored(tmp_path, "bsp-8-topk5", "bsp", 8, 0.99, compress="topk", ratio=0.05)
    _stored(tmp_path, "asp-8-topk", "asp", 8, 0.80, compress="topk")  # no asp without it
    run = advise("--hosts", "8", "--compute-time", "10ms", "--compressors", "none", "fp16",
                 "topk", "qsgd", "--json", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].startswith("evidence: 3 of the 5 completed runs of cnn on mnist5k")
    shown = {line.split()[1 if line.split()[0] == "used" else 2]: line for line in lines[2:7]}
    assert shown["bsp-8-topk"].lstrip().startswith("used")
    assert shown["bsp-8-topk"].endswith("topk ratio=0.01: -3.0 points vs uncompressed (0.9300)")
    assert shown["bsp-8-topk5"].lstrip().startswith("not used")  # another ratio
    assert shown["asp-8-topk"].endswith("topk ratio=0.01: no uncompressed asp run alike")
    ranked = {o["option"]: o for o in json.loads(lines[-1])}
    topk = ranked["bsp, 1 server on worker hosts + topk"]
    assert topk["caution"] and topk["flag"] == (
        "topk ratio=0.01: 1 stored run of 8+ workers: -3.0 points vs bsp uncompressed")
    assert topk["evidence"] == ["bsp-8-topk", "bsp-8"]
    fp16 = ranked["bsp, 8 servers on worker hosts + fp16"]
    assert not fp16["caution"] and fp16["flag"].endswith(
        "-0.2 points vs bsp uncompressed, no loss beyond 0.5")
    assert fp16["evidence"] == ["bsp-8-fp16", "bsp-8"]
    qsgd = ranked["bsp, 8 servers on worker hosts + qsgd"]
    assert qsgd["caution"] and "qsgd levels=15: accuracy cost unknown" in qsgd["flag"]
    assert qsgd["evidence"] == []
    ring = ranked["ring + topk"]  # another strategy's runs do not judge it
    assert ring["caution"] and "accuracy cost unknown" in ring["flag"]
    assert not ranked["bsp, 8 servers on worker hosts"]["caution"]
    assert math.isfinite(topk["samples_per_s"])


def test_advise_rejects_an_unknown_compressor_in_one_line(advise, tmp_path):
    run = advise("--hosts", "4", "--compute-time", "1s", "--compressors", "zip",
                 "--out", str(tmp_path))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "zip" in run.stderr
