"""Splitters: what each promises of the shards, determinism, and one split per run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import polyrhythm
from helpers import small_config
from polyrhythm.config import make_config
from polyrhythm.data.splitters import ToSplit, shard_stats, split
from polyrhythm.errors import ConfigError
from polyrhythm.runtime.job import plan_data


def settings(**fields):
    return make_config({"dataset": "digits", **fields}).data


def labels_of(counts: list[int]) -> np.ndarray:
    """Labels with these per-class counts, interleaved (as a data set's rows might be)."""
    rng = np.random.default_rng(1)
    return rng.permutation(np.repeat(np.arange(len(counts)), counts))


def no_features():
    raise AssertionError("this splitter should not read samples")


@pytest.mark.parametrize("workers", [1, 3, 4, 7])
@pytest.mark.parametrize("counts", [[500] * 10, [7, 30, 1, 13, 101, 2]])
def test_stratified_shards_hold_every_class_within_one_example(workers, counts):
    labels = labels_of(counts)
    shards = split(ToSplit(labels, len(counts), no_features), workers, 0,
                   settings(sharding="stratified"))
    assert sorted(np.concatenate(shards).tolist()) == list(range(len(labels)))
    per_class = np.array([np.bincount(labels[s], minlength=len(counts)) for s in shards])
    assert (per_class.max(0) - per_class.min(0) <= 1).all()
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_random_and_stratified_follow_the_seed_and_mod_does_not():
    data = ToSplit(labels_of([50] * 4), 4, no_features)
    for name in ("random", "stratified"):
        a, b, c = (split(data, 3, seed, settings(sharding=name)) for seed in (5, 5, 6))
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    shards = split(data, 3, 5, settings(sharding="mod"))
    assert [s.tolist() for s in shards] == [list(range(w, 200, 3)) for w in range(3)]


def test_distribution_aware_copies_sparse_neighbourhoods_to_every_worker():
    # Two dense blobs of 100 and three points far from everything and each other.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, (100, 4)), rng.normal(5, 0.1, (100, 4)),
                        [[50, 0, 0, 0], [0, 50, 0, 0], [0, 0, 50, 0]]]).astype(np.float32)
    labels = np.concatenate([np.zeros(100), np.ones(100), [0, 1, 0]]).astype(np.int64)
    shards = split(ToSplit(labels, 2, lambda: x), 4, 0,
                   settings(sharding="distribution-aware", clusters=5, components=4))
    outliers = {200, 201, 202}
    for s in shards:
        assert outliers <= set(s.tolist())  # each sparse neighbourhood on every worker
    rest = np.concatenate([[i for i in s if i not in outliers] for s in shards])
    assert sorted(rest.tolist()) == list(range(200))  # the dense ones dealt, once each
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    stats = shard_stats(shards, labels, 2)
    assert [s["copies"] for s in stats] == [3] * 4


def test_distribution_aware_keeps_randoms_epoch_and_reaches_the_run(tmp_path):
    # So many clusters on digits that many hold 2 or fewer examples: copies, and yet as
    # many steps per epoch as a random split.
    common = {"strategy": "bsp", "workers": 2, "epochs": 1, "dataset": "digits",
              "steps_per_epoch": None, "lr_decay_every": 0}
    aware = polyrhythm.train(small_config(tmp_path, sharding="distribution-aware",
                                          clusters=600, **common))
    plain = polyrhythm.train(small_config(tmp_path, **common))
    shards = aware["data"]["shards"]
    assert all(s["copies"] > 0 for s in shards)
    assert sum(s["examples"] for s in shards) > aware["data"]["train_examples"]
    assert aware["weight_updates"] == plain["weight_updates"] == 1617 // 64
    assert plain["data"]["sharding"] == "random" and aware["data"]["sharding"] == (
        "distribution-aware")


COUNT_FILE = Path(tempfile.gettempdir()) / "polyrhythm-test-splits"


def counting_split(data, workers, seed, settings):
    """A user's splitter that notes each call in COUNT_FILE."""
    with COUNT_FILE.open("a") as f:
        f.write(f"{seed}\n")
    return [np.arange(w, len(data.labels), workers) for w in range(workers)]


def test_the_splitter_runs_once_per_run_and_its_shards_reach_every_worker(tmp_path):
    COUNT_FILE.unlink(missing_ok=True)
    summary = polyrhythm.train(small_config(tmp_path, strategy="asp", workers=3, epochs=1,
                                            steps_per_epoch=2, dataset="digits",
                                            sharding="test_sharding:counting_split"))
    assert COUNT_FILE.read_text() == "0\n"  # one call, by one process, of 4
    COUNT_FILE.unlink()
    assert [s["examples"] for s in summary["data"]["shards"]] == [539, 539, 539]


def test_sharding_flags_are_checked():
    with pytest.raises(ConfigError, match="sharding must be one of random, mod"):
        make_config({"sharding": "alphabetical"})
    with pytest.raises(ConfigError, match="read by --sharding distribution-aware only"):
        make_config({"sharding": "stratified", "clusters": 4})
    plan = plan_data(make_config({"dataset": "digits", "workers": 2, "seed": 3}))
    again = plan_data(make_config({"dataset": "digits", "workers": 2, "seed": 3}))
    assert all(np.array_equal(a, b) for a, b in zip(plan.shards, again.shards, strict=True))


def test_polyrhythm_shard_prints_each_workers_share_and_draws_it(tmp_path):
    plot = tmp_path / "shards.png"
    run = subprocess.run([sys.executable, "-m", "polyrhythm.cli", "shard", "--dataset", "digits",
                          "--workers", "3", "--sharding", "stratified", "--plot", str(plot)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("digits, 3 workers, sharding stratified (seed 0): 1,617 training")
    rows = [line.split() for line in lines[2:5]]
    assert [r[0] for r in rows] == ["0", "1", "2"] and [r[1] for r in rows] == ["539"] * 3
    counts = np.array([[int(c) for c in r[5:]] for r in rows])
    assert counts.shape == (3, 10) and (counts.max(0) - counts.min(0) <= 1).all()
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and plot.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "polyrhythm.cli", "shard", "--plot", "x.jpg"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "PNG" in bad.stderr
