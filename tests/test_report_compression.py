"""The report's figure of bytes per step against validation accuracy and its table: the points
are what each run's traffic says, the table compares each compressed group with its
uncompressed one, reports without compression leave both out, and an older store (schema 4,
before compression) still reports. One test trains for real, the others use the fabricated
runs of test_report."""

from __future__ import annotations

import json
import sqlite3
from argparse import Namespace

import numpy as np
import pytest

import polyrhythm
from helpers import small_config
from polyrhythm.cli import runs
from polyrhythm.metrics.store import SCHEMA_VERSION, RunStore
from polyrhythm.report import write_report
from polyrhythm.report.compression import bytes_vs_accuracy
from polyrhythm.report.data import group_runs, load_runs
from test_report import ALWAYS, PNG_MAGIC, fabricate_run

TOPK = {"compress": "topk", "ratio": 0.01}


def traffic_per_step(summary: dict) -> float:
    """Bytes every rank sent (and handed to native collectives) over all workers' steps."""
    sent = sum(r["bytes_sent"] + r["native_collective_bytes"]
               for r in summary["traffic_per_rank"])
    return sent / sum(w["steps"] for w in summary["per_worker"])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """bsp with and without fp16, allreduce with and without top-k, two seeds each."""
    tmp_path = tmp_path_factory.mktemp("compressed")
    store = RunStore(tmp_path / "polyrhythm.db")
    kinds = [("bsp", {}), ("bsp", {"compress": "fp16"}), ("allreduce", {}), ("allreduce", TOPK)]
    ids = [fabricate_run(store, tmp_path, strategy, seed, index=2 * i + seed, **fields)
           for i, (strategy, fields) in enumerate(kinds) for seed in (0, 1)]
    return store, ids


def section(text: str, title: str) -> list[list[str]]:
    """The rows of a Markdown report's table, as cells."""
    body = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split(" | ")]
            for line in body.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_each_point_is_the_mean_bytes_per_step_and_accuracy_of_its_repeats(mixed):
    store, ids = mixed
    summaries = {r["run_id"]: json.loads(r["summary"]) for r in store.runs()}
    groups = group_runs(load_runs(store.path, ids))
    (ax,) = bytes_vs_accuracy(groups).axes
    assert ax.get_xscale() == "log"
    drawn = {line.get_label(): line for line in ax.get_lines()
             if not line.get_label().startswith("_")}  # error bars' caps are lines too
    assert sorted(drawn) == sorted(f"{g.label} (2 runs)" for g in groups)
    for group in groups:
        line = drawn[f"{group.label} (2 runs)"]
        per_run = [summaries[r.run_id] for r in group.runs]
        assert line.get_xdata()[0] == pytest.approx(np.mean([traffic_per_step(s)
                                                             for s in per_run]))
        assert line.get_ydata()[0] == pytest.approx(
            100 * np.mean([s["final_val_accuracy"] for s in per_run]))
    # Colour: the strategy (two here); marker: the compressor.
    colors = {label.split()[0]: set() for label in drawn}
    for label, line in drawn.items():
        colors[label.split()[0]].add(line.get_color())
    assert all(len(c) == 1 for c in colors.values()) and len(set.union(*colors.values())) == 2
    markers = {label: line.get_marker() for label, line in drawn.items()}
    assert markers["bsp (2 runs)"] == markers["allreduce (2 runs)"]
    assert len(set(markers.values())) == 3  # none, fp16, topk


def test_the_table_compares_each_compressed_group_with_its_uncompressed_one(mixed, tmp_path):
    store, ids = mixed
    text = write_report(store.path, ids, tmp_path, "Compressed", fmt="md").read_text()
    rows = {row[0]: row for row in section(text, "Compression")}
    assert list(rows) == ["bsp", "bsp compress=fp16", "allreduce",
                          "allreduce compress=topk ratio=0.01"]
    summaries = {r["run_id"]: json.loads(r["summary"]) for r in store.runs()}
    groups = {g.label: g for g in group_runs(load_runs(store.path, ids))}

    def mean(label: str, measure) -> float:
        return float(np.mean([measure(summaries[r.run_id]) for r in groups[label].runs]))

    for label, base in (("bsp compress=fp16", "bsp"),
                        ("allreduce compress=topk ratio=0.01", "allreduce")):
        (_, strategy, compressor, feedback, runs, _, ratio, share, _, delta) = rows[label]
        assert strategy == base and runs == "2"
        assert float(ratio) == pytest.approx(
            mean(label, traffic_per_step) / mean(base, traffic_per_step), rel=2e-3)
        accuracy = mean(label, lambda s: 100 * s["final_val_accuracy"]) - mean(
            base, lambda s: 100 * s["final_val_accuracy"])
        assert float(delta) == pytest.approx(accuracy, abs=0.006)
        assert (compressor, feedback, share) == {
            "bsp": ("fp16", "off", "0.5"), "allreduce": ("topk ratio=0.01", "on", "0.02")}[base]
    assert rows["bsp"][2:4] == ["none", "–"] and rows["bsp"][6] == "reference"
    assert rows["allreduce"][7] == "1"
    bytes_cell = rows["allreduce"][5].replace(",", "").split(" ± ")[0]
    assert float(bytes_cell) == pytest.approx(mean("allreduce", traffic_per_step), abs=0.5)
    assert "![Bytes per step against validation accuracy](bytes_vs_accuracy.png)" in text
    assert (tmp_path / "bytes_vs_accuracy.png").read_bytes().startswith(PNG_MAGIC)


def test_a_compressed_run_without_its_uncompressed_one_has_no_reference(mixed, tmp_path):
    store, ids = mixed
    text = write_report(store.path, ids[-2:], tmp_path, "Top-k", fmt="md").read_text()
    (row,) = section(text, "Compression")
    assert row[1:3] == ["allreduce", "topk ratio=0.01"] and row[6] == row[9] == "–"


def test_a_report_without_compression_has_neither_figure_nor_table(mixed, tmp_path):
    store, ids = mixed
    html = write_report(store.path, ids, tmp_path, "All").read_text()
    assert 'id="bytes_vs_accuracy"' in html and 'id="compression-table"' in html
    uncompressed = [ids[0], ids[1], ids[4], ids[5]]
    html = write_report(store.path, uncompressed, tmp_path, "Plain").read_text()
    assert 'id="bytes_vs_accuracy"' not in html and 'id="compression-table"' not in html
    assert "Bytes per step" not in html
    assert not (tmp_path / "bytes_vs_accuracy.png").exists()  # the last report's, removed
    assert sorted(p.stem for p in tmp_path.glob("*.png")) == sorted(ALWAYS)


def test_a_schema_4_store_from_before_compression_still_reports(tmp_path):
    """A store as polyrhythm wrote it before compressors: no iterations.compress_s (nor the
    later read_s), no compression in summaries or spans. It gains the columns when opened,
    and reports."""
    store = RunStore(tmp_path / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, "bsp", seed, workers=2, index=seed) for seed in (0, 1)]
    with sqlite3.connect(store.path) as conn:
        for run_id, text in conn.execute("SELECT run_id, summary FROM runs").fetchall():
            summary = json.loads(text)
            del summary["compression"]
            for worker in summary["per_worker"]:
                del worker["compress_s"], worker["read_s"]
            conn.execute("UPDATE runs SET summary = ? WHERE run_id = ?",
                         (json.dumps(summary), run_id))
        conn.execute("ALTER TABLE iterations DROP COLUMN compress_s")
        conn.execute("ALTER TABLE iterations DROP COLUMN read_s")
        conn.execute("PRAGMA user_version = 4")
    text = write_report(store.path, ids, tmp_path / "md", "Old", fmt="md").read_text()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert "## Compression" not in text and "bytes_vs_accuracy" not in text
    header = next(line for line in text.split("## Time breakdown")[1].splitlines()
                  if line.startswith("| group"))
    (row,) = section(text, "Time breakdown")
    assert row[header.split(" | ").index("compress (ms)")] == "0.00"
    assert row[header.split(" | ").index("read (ms)")] == "0.00"
    drawn = {p.stem for p in (tmp_path / "md").glob("*.png")}
    assert drawn == set(ALWAYS)


def test_real_runs_report_the_bytes_their_traffic_says(tmp_path, capsys):
    """allreduce with and without top-k, trained: the table's bytes per step are the runs'
    traffic per step, top-k's a small share of the dense run's; `polyrhythm runs` lists
    what each compressed with."""
    summaries = [polyrhythm.train(small_config(tmp_path, strategy="allreduce", workers=2,
                                               epochs=1, steps_per_epoch=6, **fields))
                 for fields in ({}, TOPK)]
    store_path = tmp_path / "runs" / "polyrhythm.db"
    text = write_report(store_path, [s["run_id"] for s in summaries], tmp_path / "md",
                        "Real", fmt="md").read_text()
    dense, topk = section(text, "Compression")
    for row, summary in zip((dense, topk), summaries, strict=True):
        assert float(row[5].replace(",", "")) == pytest.approx(traffic_per_step(summary),
                                                               abs=0.5)
    assert topk[2] == "topk ratio=0.01" and float(topk[6]) < 0.1
    assert float(topk[7]) == pytest.approx(summaries[1]["compression"]["dense_share"], rel=1e-2)
    assert (tmp_path / "md" / "bytes_vs_accuracy.png").read_bytes().startswith(PNG_MAGIC)

    assert runs.run(Namespace(out=str(tmp_path / "runs"), json=False)) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[-1] == "compress"
    listed = {line.split()[0]: line for line in rows}
    assert listed[summaries[0]["run_id"]].endswith("  none")
    assert listed[summaries[1]["run_id"]].endswith("  topk ratio=0.01")
    assert runs.run(Namespace(out=str(tmp_path / "runs"), json=True)) == 0
    listed = {(row := json.loads(line))["run_id"]: row["compress"]
              for line in capsys.readouterr().out.splitlines()}  # runs of one second: any order
    assert listed == {summaries[0]["run_id"]: "none", summaries[1]["run_id"]: "topk ratio=0.01"}
