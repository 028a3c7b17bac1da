"""CIFAR from its real on-disk format: read safely, trained on, and held by each process
only as far as it needs."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import polyrhythm
from cifar_files import write_cifar
from polyrhythm.cli import main
from polyrhythm.config import make_config
from polyrhythm.data.datasets import open_source
from polyrhythm.errors import DataError
from polyrhythm.metrics.store import RunStore


def source(**fields):
    config = make_config(fields)
    return open_source(config.data, config.seed)


def test_cifar10_reads_the_archive_and_its_folder_alike(tmp_path):
    folder, archive = write_cifar(tmp_path, "cifar10", train_rows=45, test_rows=12)
    got = []
    for path in (folder, archive):
        s = source(dataset="cifar10", data_path=str(path))
        s.check()
        assert s.shape == (3, 32, 32) and s.classes == 10 and s.given_val == 12
        x, val = s.rows(np.array([44, 0, 9, 10]), np.arange(45, 57))
        assert x.dtype == np.uint8 and x.shape == (4, 3, 32, 32) and val.shape == (12, 3, 32, 32)
        got.append((x, s.labels()))
    assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
    # Rows 9 and 10 open data_batch_2 (45 rows over 5 members: 9 each).
    member = pickle.loads((folder / "data_batch_2").read_bytes(), encoding="bytes")
    assert np.array_equal(got[0][0][2:].reshape(2, -1), member[b"data"][:2])


@pytest.mark.parametrize(("labels", "classes"), [("fine", 100), ("coarse", 20)])
def test_cifar100_gives_fine_or_coarse_labels(tmp_path, labels, classes):
    folder, _ = write_cifar(tmp_path, "cifar100", train_rows=30, test_rows=6, archive=False)
    s = source(dataset="cifar100", data_path=str(folder), labels=labels)
    member = pickle.loads((folder / "train").read_bytes(), encoding="bytes")
    assert s.classes == classes
    assert s.labels()[:30].tolist() == member[f"{labels}_labels".encode()]


class _Payload:
    """A pickle that runs a command when it is loaded the unsafe way."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _bad_archives(tmp_path):
    """(case, path, what the one-line error says) of each kind of bad data path."""
    folder, archive = write_cifar(tmp_path / "good", "cifar10")
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    evil_folder, _ = write_cifar(tmp_path / "evil", "cifar10", archive=False)
    member = pickle.loads((evil_folder / "data_batch_3").read_bytes(), encoding="bytes")
    member[b"labels"] = _Payload(tmp_path / "ran")
    (evil_folder / "data_batch_3").write_bytes(pickle.dumps(member, protocol=2))
    return [("truncated", truncated, "cannot read archive"),
            ("missing", tmp_path / "nowhere.tar.gz", "does not exist"),
            ("not a pickle", _not_a_pickle(tmp_path, folder), "not a readable pickle"),
            ("evil", evil_folder, "refuses to unpickle posix.system")]


def _not_a_pickle(tmp_path, folder):
    import shutil

    copy = tmp_path / "garbled"
    shutil.copytree(folder, copy)
    (copy / "test_batch").write_bytes(b"this is not a pickle")
    return copy


def test_bad_cifar_paths_are_one_line_errors_and_nothing_they_hold_runs(tmp_path, capfd):
    for case, path, message in _bad_archives(tmp_path):
        with pytest.raises(DataError, match=message):
            source(dataset="cifar10", data_path=str(path)).check()
        # `polyrhythm train` on it: the command's main, in this process.
        code = main(["train", "--dataset", "cifar10", "--data-path", str(path), "--workers",
                     "1", "--epochs", "1", "--out", str(tmp_path / "runs")])
        stdout, stderr = capfd.readouterr()
        assert code == 2, (case, stderr)
        assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert message in stderr and stdout == "", (case, stderr)
    assert not (tmp_path / "ran").exists()  # the command never ran
    assert not (tmp_path / "runs").exists()  # and no run was recorded


def test_bsp_trains_resnet20_on_a_tiny_cifar10_archive(tmp_path):
    _, archive = write_cifar(tmp_path, "cifar10", train_rows=64, test_rows=16)
    summary = polyrhythm.train(strategy="bsp", workers=2, model="resnet20", dataset="cifar10",
                               data_path=str(archive), augment=True, batch_size=16, epochs=2,
                               out=str(tmp_path / "runs"))
    assert summary["status"] == "completed" and summary["weight_updates"] == 8
    assert summary["data"]["train_examples"] == 64 and summary["data"]["val_examples"] == 16
    assert [s["examples"] for s in summary["data"]["shards"]] == [32, 32]
    assert summary["parameters"] == 269_722


def test_each_process_holds_only_its_share_of_a_cifar10_sized_data_set(tmp_path):
    # 50,000 + 10,000 images of 3x32x32: 184 MB as bytes, 737 MB as float32 in every process
    # before. Now a worker holds its quarter and the test images as bytes, a server nothing.
    folder, _ = write_cifar(tmp_path, "cifar10", train_rows=50_000, test_rows=10_000,
                            archive=False)
    summary = polyrhythm.train(strategy="bsp", workers=4, model="cnn", dataset="cifar10",
                               data_path=str(folder), epochs=1, steps_per_epoch=10,
                               out=str(tmp_path / "runs"))
    rows = RunStore(tmp_path / "runs" / "polyrhythm.db").series("resources", summary["run_id"])
    peak = {}
    for r in rows:
        key = (r["role"], r["rank"])
        peak[key] = max(peak.get(key, 0), r["rss_bytes"])
    workers = [v for (role, _), v in peak.items() if role == "worker"]
    servers = [v for (role, _), v in peak.items() if role == "server"]
    assert len(workers) == 4 and len(servers) == 1
    mb = 1 << 20
    print("peak RSS MB: workers", [round(w / mb) for w in workers], "server",
          round(servers[0] / mb))
    assert max(workers) < 450 * mb and servers[0] < 350 * mb
