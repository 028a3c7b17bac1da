"""Data sets, their plans and batch schedules: pure functions, no processes."""

import numpy as np
import pytest
import torch

from polyrhythm.config import make_config
from polyrhythm.data.datasets import open_source
from polyrhythm.data.plan import hold_out, load_part
from polyrhythm.data.sharding import batch_slice, epoch_order, steps_per_epoch, worker_batch_sizes
from polyrhythm.data.source import Dataset, Normalisation
from polyrhythm.errors import ConfigError, DataError
from polyrhythm.runtime.job import plan_data, whole_data


def whole(fields: dict) -> Dataset:
    """Every row of the data set a config of these fields names, as a worker holds them."""
    config = make_config(fields)
    source = open_source(config.data, config.seed)
    labels = source.labels()
    (x,) = source.rows(np.arange(len(labels)))
    return Dataset.of(source, x, labels)


@pytest.mark.parametrize(("batch", "workers", "expected"),
                         [(64, 2, [32, 32]), (64, 3, [22, 21, 21]), (4, 4, [1, 1, 1, 1])])
def test_global_batch_is_split_across_workers(batch, workers, expected):
    assert worker_batch_sizes(batch, workers) == expected


def test_an_epoch_visits_each_shard_example_once_and_wraps_when_short():
    order = epoch_order(np.arange(10), 0, 0, 0)
    seen = np.concatenate([batch_slice(order, 5, s) for s in range(2)])
    assert sorted(seen.tolist()) == list(range(10))
    assert len(batch_slice(order, 4, 2)) == 4  # 8..11 wraps to the start
    assert steps_per_epoch(4500, 64) == 70 and steps_per_epoch(4500, 64, cap=10) == 10
    assert not (epoch_order(np.arange(10), 0, 1, 0) == epoch_order(np.arange(10), 1, 1, 0)).all()


@pytest.mark.parametrize(("dataset", "size", "shape"),
                         [("mnist5k", 5000, (1, 28, 28)), ("digits", 1797, (1, 8, 8))])
def test_packaged_datasets_are_kept_as_bytes_and_normalised_per_batch(dataset, size, shape):
    data = whole({"dataset": dataset})
    assert len(data) == size and data.shape == shape and data.classes == 10
    assert data.x.dtype == torch.uint8  # a quarter of float32
    x, y = data.batch(slice(None))
    assert x.dtype == torch.float32
    assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-2
    assert sorted(set(y.tolist())) == list(range(10))


def test_synthetic_dataset_has_the_asked_shape_and_classes():
    data = whole({"dataset": "synthetic", "synthetic_shape": [3, 4, 4],
                  "synthetic_classes": 5, "synthetic_size": 50})
    assert data.x.shape == (50, 3, 4, 4) and data.classes == 5
    assert np.bincount(data.y.numpy()).tolist() == [10] * 5


def test_validation_is_held_out_and_seeded_or_the_sources_own():
    train, val = hold_out(1797, 0, 0.1, seed=0)
    assert len(val) == 180 and sorted([*train, *val]) == list(range(1797))
    assert (hold_out(1797, 0, 0.1, seed=0)[0] == train).all()
    assert not (hold_out(1797, 0, 0.1, seed=1)[0] == train).all()
    train, val = hold_out(60, 10, 0.1, seed=0)  # a test part: the last 10 rows, always
    assert val.tolist() == list(range(50, 60)) and train.tolist() == list(range(50))


def test_a_worker_holds_its_shard_and_the_validation_set_only():
    config = make_config({"dataset": "digits", "workers": 3, "sharding": "stratified"})
    source = open_source(config.data, config.seed)
    plan = plan_data(config, source)
    everything = whole({"dataset": "digits"})
    for w in range(3):
        mine, val = load_part(source, plan, w)
        rows = plan.train[plan.shards[w]]
        assert len(mine) == len(plan.shards[w]) < len(plan.train)
        assert torch.equal(mine.x, everything.x[torch.from_numpy(rows)])
        assert torch.equal(mine.y, everything.y[torch.from_numpy(rows)])
        assert torch.equal(val.x, everything.x[torch.from_numpy(plan.val)])
    _, train, _ = whole_data(config)
    assert len(train) == len(plan.train)


def test_augmentation_crops_and_flips_from_the_seed_and_leaves_validation_alone():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32) % 251
    data = Dataset(x.to(torch.uint8), torch.tensor([0, 1]), 2,
                   Normalisation((0.0,), (1.0,)), augment=True)
    plain, _ = data.batch(slice(None))
    one, _ = data.batch(slice(None), torch.Generator().manual_seed(5))
    again, _ = data.batch(slice(None), torch.Generator().manual_seed(5))
    other, _ = data.batch(slice(None), torch.Generator().manual_seed(6))
    assert torch.equal(plain, x) and torch.equal(one, again) and not torch.equal(one, other)
    assert one.shape == x.shape
    # Each image is a window of its padded copy, flipped or not.
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(2):
        windows = [padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(one[i], w) or torch.equal(one[i], w.flip(-1)) for w in windows)


def test_npz_arrays_load_with_their_own_validation_set(tmp_path):
    path = tmp_path / "mine.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, (40, 1, 6, 6)), y=np.arange(40) % 4,
             x_val=rng.integers(0, 256, (8, 1, 6, 6)), y_val=np.arange(8) % 4)
    config = make_config({"dataset": "npz", "data_path": str(path), "workers": 2})
    plan, train, val = whole_data(config)
    assert len(train) == 40 and len(val) == 8 and plan.classes == 4
    assert train.x.dtype == torch.uint8 and plan.shape == (1, 6, 6)


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.zeros((4, 2))}, "must hold arrays x and y"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(3, np.int64)}, "x must be samples"),
    ({"x": np.zeros((4, 2)), "y": np.full(4, 0.5)}, "integer labels"),
    ({"x": np.array([{}, {}], dtype=object).reshape(2, 1), "y": np.zeros(2, np.int64)},
     "allow_pickle"),
])
def test_bad_npz_files_are_one_line_errors(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    config = make_config({"dataset": "npz", "data_path": str(path)})
    with pytest.raises(DataError, match=message):
        source = open_source(config.data, config.seed)
        source.check()
        source.labels()


def users_digits(seed):
    """A user's data set: arrays from a function."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(30, 5)).astype(np.float32), np.arange(30) % 3


def test_a_users_function_is_a_data_set():
    plan, train, _ = whole_data(make_config({"dataset": "test_data:users_digits",
                                             "workers": 2}))
    assert plan.classes == 3 and train.x.dtype == torch.float32 and plan.shape == (5,)
    with pytest.raises(ConfigError, match="unknown dataset 'nope'"):
        make_config({"dataset": "nope"})
