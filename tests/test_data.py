"""Data sets, sharding and batch schedules: pure functions, no processes."""

import pickle
import tarfile

import numpy as np
import pytest

from polyrhythm.config import make_config
from polyrhythm.data.datasets import load_dataset, train_val_split
from polyrhythm.data.sharding import (
    batch_slice,
    epoch_order,
    random_shards,
    steps_per_epoch,
    worker_batch_sizes,
)
from polyrhythm.errors import DataError


def load(fields: dict):
    """The data set a config of these fields names."""
    config = make_config(fields)
    return load_dataset(config.data, config.seed)


@pytest.mark.parametrize(("n", "workers"), [(10, 3), (4500, 4), (7, 7), (100, 1)])
def test_random_shards_partition_the_data_in_balanced_pieces(n, workers):
    shards = random_shards(n, workers, seed=3)
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_seed_fixes_sharding_and_order_and_changes_with_it():
    a, b, c = (random_shards(100, 2, s) for s in (1, 1, 2))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not all((x == y).all() for x, y in zip(a, c, strict=True))
    assert (epoch_order(a[0], 0, 1, 0) == epoch_order(b[0], 0, 1, 0)).all()
    assert not (epoch_order(a[0], 0, 1, 0) == epoch_order(a[0], 1, 1, 0)).all()


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


@pytest.mark.parametrize(("dataset", "size", "shape"),
                         [("mnist5k", 5000, (1, 28, 28)), ("digits", 1797, (1, 8, 8))])
def test_packaged_datasets_load_normalised(dataset, size, shape):
    data = load({"dataset": dataset})
    assert len(data) == size and data.shape == shape and data.classes == 10
    assert abs(data.x.mean().item()) < 1e-3 and abs(data.x.std().item() - 1) < 1e-2
    assert sorted(set(data.y.tolist())) == list(range(10))


def test_synthetic_dataset_has_the_asked_shape_and_classes():
    config = make_config({"dataset": "synthetic", "synthetic_shape": [3, 4, 4],
                          "synthetic_classes": 5, "synthetic_size": 50})
    data = load_dataset(config.data, config.seed)
    assert data.x.shape == (50, 3, 4, 4) and data.classes == 5
    assert np.bincount(data.y.numpy()).tolist() == [10] * 5


def test_validation_split_is_held_out_and_seeded():
    data = load({"dataset": "digits"})
    train, val = train_val_split(data, 0.1, seed=0)
    assert len(val) == 180 and len(train) + len(val) == len(data)
    again, _ = train_val_split(data, 0.1, seed=0)
    assert (train.y == again.y).all()


def write_cifar10(root, per_batch=4):
    """A tiny archive in the standard CIFAR-10 python-pickle layout."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return folder, archive


def test_cifar10_reads_the_pickle_archive_and_its_directory(tmp_path):
    folder, archive = write_cifar10(tmp_path)
    for path in (folder, archive):
        data = load({"dataset": "cifar10", "data_path": str(path)})
        assert data.x.shape == (24, 3, 32, 32) and data.classes == 10


def test_cifar10_with_a_member_missing_names_it(tmp_path):
    folder, _ = write_cifar10(tmp_path)
    (folder / "test_batch").unlink()
    with pytest.raises(DataError, match="lacks test_batch"):
        load({"dataset": "cifar10", "data_path": str(folder)})
