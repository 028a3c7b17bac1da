"""The csv data set: plain, gzip and one-file zip text, with or without a header, read in
chunks; exact values; every bad file a one-line DataError naming it (the CLI's side of those
lines: test_errors.py)."""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from polyrhythm.config import make_config
from polyrhythm.data import csvfile
from polyrhythm.data.datasets import open_source
from polyrhythm.data.plan import load_part
from polyrhythm.errors import ConfigError, DataError
from polyrhythm.runtime.job import plan_data

# label, then three features: what HIGGS looks like, in small
ROWS = np.array([[1, 0.5, -2.0, 10.0],
                 [0, 1.5, 0.0, 20.0],
                 [1, -0.5, 2.0, 30.0],
                 [0, 2.5, 4.0, 40.0],
                 [1, 0.25, 8.0, 50.0]])
TEXT = "".join(",".join(f"{v:g}" for v in row) + "\n" for row in ROWS)
HEADER = "label,mass,pt,eta\n"


def zipped(text: str, *names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name in names:
            z.writestr(name, text)
    return buffer.getvalue()


FORMATS = {
    "plain.csv": TEXT.encode(),
    "header.csv": (HEADER + TEXT).encode(),
    "windows.csv": (HEADER + TEXT + "\n\n").replace("\n", "\r\n").encode(),
    "bom.csv": "\ufeff".encode() + TEXT.encode(),  # a spreadsheet's UTF-8, no header
    "HIGGS.csv.gz": gzip.compress(TEXT.encode()),
    "header.csv.gz": gzip.compress((HEADER + TEXT).encode()),
    "YearPredictionMSD.txt.zip": zipped(TEXT, "YearPredictionMSD.txt"),
    "mac.zip": zipped(TEXT, "data.csv", "__MACOSX/._data.csv"),
}


def source_of(path: Path, **settings):
    return open_source(make_config({"dataset": "csv", "data_path": str(path),
                                    **settings}).data, 0)


def error_of(path: Path, **settings) -> str:
    with pytest.raises(DataError) as caught:
        source_of(path, **settings).check()
    message = str(caught.value)
    assert "\n" not in message and repr(str(path)) in message, message
    return message


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_reads_the_same_numbers(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(FORMATS[name])
    source = source_of(path)
    assert source.shape == (3,) and source.classes == 2 and source.given_val == 0
    assert source.labels().tolist() == [1, 0, 1, 0, 1]
    (picked,) = source.rows(np.array([3, 0, 3, 4]))
    assert picked.dtype == np.float32
    assert picked.tolist() == ROWS[[3, 0, 3, 4], 1:].tolist()
    features = ROWS[:, 1:]
    assert source.norm.mean == pytest.approx(features.mean(0).tolist(), abs=1e-12)
    assert source.norm.std == pytest.approx(features.std(0).tolist(), abs=1e-12)


def test_a_header_is_a_first_row_that_is_not_all_numbers_and_names_the_target(tmp_path):
    path = tmp_path / "named.csv"
    path.write_text(HEADER + TEXT)
    by_name = source_of(path, target="eta")
    assert by_name.labels().tolist() == ROWS[:, 3].tolist()
    (picked,) = by_name.rows(np.arange(5))
    assert picked.tolist() == ROWS[:, :3].tolist()  # the other columns, in order
    assert source_of(path, target="-1").labels().tolist() == ROWS[:, 3].tolist()
    assert source_of(path, target="1").labels().tolist() == ROWS[:, 1].tolist()


def test_features_are_standardised_per_column_and_the_target_only_when_asked(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text(TEXT)
    config = make_config({"dataset": "csv", "data_path": str(path), "loss": "mse",
                          "val_fraction": 0.2, "workers": 1})
    source = open_source(config.data, 0)
    plan = plan_data(config, source)
    train, val = load_part(source, plan, None)
    x = torch.cat([train.batch(slice(None))[0], val.batch(slice(None))[0]]).double()
    assert x.mean(0).abs().max() < 1e-6 and (x.std(0, unbiased=False) - 1).abs().max() < 1e-6
    assert train.y.dtype == torch.float32  # mse: values, as they are
    assert sorted(torch.cat([train.y, val.y]).tolist()) == [0, 0, 1, 1, 1]
    scaled = source_of(path, loss="mse", standardise_target=True).labels()
    assert scaled == pytest.approx((ROWS[:, 0] - 0.6) / np.std(ROWS[:, 0]), abs=1e-12)
    with pytest.raises(ConfigError, match="--standardise-target is for --loss mse only"):
        source_of(path, standardise_target=True)


def test_targets_become_what_the_loss_takes(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text(TEXT)
    for loss, dtype, stats in (("cross_entropy", np.int64, 2), ("bce", np.int64, 2),
                               ("mse", np.float32, 1)):
        config = make_config({"dataset": "csv", "data_path": str(path), "loss": loss,
                              "workers": 2, "val_fraction": 0.2, "sharding": "stratified"})
        plan = plan_data(config)
        assert plan.train_labels.dtype == dtype and plan.val_labels.dtype == dtype, loss
        # mse's values are no classes: the shard statistics count one
        assert [len(s["class_counts"]) for s in plan.summary()["shards"]] == [stats] * 2


def test_only_the_first_max_rows_count(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text(TEXT + "not,a,row,at all\n")  # never read
    source = source_of(path, max_rows=3)
    assert source.labels().tolist() == [1, 0, 1]
    assert source.rows(np.array([2]))[0].tolist() == [ROWS[2, 1:].tolist()]


def test_chunks_meet_without_seams(tmp_path, monkeypatch):
    monkeypatch.setattr(csvfile, "CHUNK_LINES", 2)  # 5 rows and a header: four chunks
    path = tmp_path / "header.csv.gz"
    path.write_bytes(gzip.compress((HEADER + TEXT).encode()))
    source = source_of(path)
    assert source.labels().tolist() == [1, 0, 1, 0, 1]
    picked, again = source.rows(np.array([4, 1, 2, 0, 3]), np.array([3, 3]))
    assert picked.tolist() == ROWS[[4, 1, 2, 0, 3], 1:].tolist()
    assert again.tolist() == ROWS[[3, 3], 1:].tolist()
    assert source.norm.mean == pytest.approx(ROWS[:, 1:].mean(0).tolist(), abs=1e-12)
    bad = tmp_path / "late.csv"
    bad.write_text(HEADER + TEXT + "1,2,x,4\n")
    assert "line 7, column 2: 'x' is not a number" in error_of(bad)


def test_a_file_shorter_than_its_plan_is_refused(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text(TEXT)
    source = source_of(path)
    source.labels()
    path.write_text(TEXT.split("\n", 2)[2])  # two rows fewer, after the plan
    with pytest.raises(DataError, match="now has 3 rows, fewer than when the run's data plan"):
        source.rows(np.array([4]))


BAD_TEXT = [
    pytest.param("1,2,3\n4,5\n", "line 2 has 2 columns, the first row 3", id="ragged"),
    pytest.param("1,2,3\n4,5,6,7\n", "line 2 has 4 columns, the first row 3", id="ragged-long"),
    pytest.param("a,b,c\n1,2,3\n4,five,6\n", "line 3, column 1: 'five' is not a number",
                 id="non-numeric"),
    pytest.param("1,2,3\n4,,6\n", "line 2, column 1: '' is not a number", id="empty-cell"),
    pytest.param("1,2,3\n4,nan,6\n", "line 2, column 1: 'nan' is not a finite number",
                 id="nan"),
    pytest.param("1,2,3\n4,5,inf\n", "line 2, column 2: 'inf' is not a finite number",
                 id="inf"),
    pytest.param("Dear reader,\nhere is, a letter\n", "line 2, column 0: 'here is' is not a "
                 "number", id="not-csv"),
    pytest.param("Dear reader,\nthis is a letter.\n", "line 2 has 1 column, the first row 2",
                 id="prose"),
    pytest.param("1,2,3\n", "has 1 data row; a run needs at least 2", id="one-row"),
    pytest.param("a,b,c\n", "has 0 data rows; a run needs at least 2", id="header-only"),
    pytest.param("", "holds no rows", id="empty"),
    pytest.param("\n\n", "holds no rows", id="blank"),
    pytest.param("1\n2\n", "has 1 column; it needs a target and at least one feature",
                 id="one-column"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_TEXT)
def test_bad_text_is_one_line_naming_the_file(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert needle in error_of(path)
    path = tmp_path / "bad.csv.gz"  # the same, compressed
    path.write_bytes(gzip.compress(text.encode()))
    assert needle in error_of(path)


def test_bad_target_columns(tmp_path):
    plain, named = tmp_path / "plain.csv", tmp_path / "named.csv"
    plain.write_text(TEXT)
    named.write_text(HEADER + TEXT)
    assert "has no column 4: its 4 columns are 0 to 3" in error_of(plain, target="4")
    assert "has no column -5" in error_of(plain, target="-5")
    assert ("has no header row: --target takes a column number (0 to 3), not 'mass'"
            in error_of(plain, target="mass"))
    assert ("has no column named 'energy' (its columns: label, mass, pt, eta)"
            in error_of(named, target="energy"))


def test_bad_files_and_archives(tmp_path):
    assert "does not exist" in error_of(tmp_path / "missing.csv.gz")
    assert "is not a file" in error_of(tmp_path)
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    assert "is not UTF-8 text" in error_of(binary)
    truncated = tmp_path / "truncated.csv.gz"
    truncated.write_bytes(gzip.compress(TEXT.encode() * 50)[:40])
    assert "cannot read" in error_of(truncated)
    empty = tmp_path / "empty.zip"
    empty.write_bytes(zipped(TEXT))
    assert "holds 0 files; it must hold exactly one CSV file" in error_of(empty)
    several = tmp_path / "several.zip"
    several.write_bytes(zipped(TEXT, "a.csv", "b.csv"))
    assert "holds 2 files (a.csv, b.csv); it must hold exactly one" in error_of(several)
    broken = tmp_path / "broken.zip"
    broken.write_bytes(zipped(TEXT * 50, "a.csv")[:-30])  # its directory cut short
    assert "cannot read zip" in error_of(broken)
    corrupt = bytearray(zipped(TEXT * 50, "a.csv"))
    corrupt[60] ^= 0xFF  # a byte of its compressed data
    broken.write_bytes(bytes(corrupt))
    assert "cannot read" in error_of(broken)


def test_a_huge_declared_or_read_size_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(csvfile, "MAX_TEXT_BYTES", 2**30 // 2**20)  # 1 KiB, for the test
    big = TEXT * 30  # 2.3 KiB
    member = tmp_path / "bomb.zip"
    member.write_bytes(zipped(big, "bomb.csv"))
    assert "declares 0.0 GiB of text, more than" in error_of(member)
    plain = tmp_path / "big.csv"
    plain.write_text(big)
    assert "declares" in error_of(plain)
    streamed = tmp_path / "big.csv.gz"  # gzip declares no reliable size: counted as read
    streamed.write_bytes(gzip.compress(big.encode()))
    assert "holds more than" in error_of(streamed)
