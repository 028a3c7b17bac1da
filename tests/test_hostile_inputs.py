"""Hostile inputs (issue 44, findings 5 to 7): ids read from a store never become paths out
of the reports folder, damaged files and stores are one-line errors, and no reader holds
more than its limit or waits forever on a named pipe.

Each test here failed before its fix (a report written outside `--out`, a traceback, a
read without bound, a blocked process); the fuzzers of tests/test_fuzz.py drive the same
classes of input at random. Probes of what may block run in a process of their own, with a
bound (hostile.probe), so that they fail rather than hang where the fix is missing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import tarfile
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import hostile
import polyrhythm.data.pickles
from cifar_files import write_cifar
from polyrhythm.api import resume, resume_script
from polyrhythm.cli import main
from polyrhythm.config import RunConfig, load_config, make_config
from polyrhythm.data.csvfile import read_table
from polyrhythm.data.datasets import NpzSource, load_cifar10
from polyrhythm.errors import ConfigError, DataError, PolyrhythmError, StoreError
from polyrhythm.metrics.store import RunStore
from polyrhythm.report import write_report


def one_line_error(capsys, args: list[str]) -> str:
    """`polyrhythm ARGS` ends with exit code 2 and one line on stderr, which it returns."""
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("polyrhythm: error: "), err
    return lines[0]


def one_line(exc: BaseException) -> str:
    assert isinstance(exc, PolyrhythmError) and len(str(exc).splitlines()) == 1, repr(exc)
    return str(exc)


# --- finding 5: ids read from a store escape --out ---------------------------------------------

def _escaping_store(tmp_path: Path, sweep_id: str = hostile.SWEEP_ID,
                    run_id: str = hostile.RUN_ID) -> Path:
    """The store under tmp_path/runs with its sweep and run stored under these ids."""
    out = tmp_path / "runs"
    tables = hostile.rows(out)
    for table in tables.values():
        for row in table:
            if "run_id" in row:
                row["run_id"] = run_id
            if "sweep_id" in row:
                row["sweep_id"] = sweep_id
    hostile.write_store(out, tables)
    return out


@pytest.mark.parametrize("target", [["--latest"], ["--sweep", "../../escaped"]])
def test_a_stored_sweep_id_that_is_a_path_names_no_folder(tmp_path, capsys, target):
    """A sweep id `../../escaped` in the store: the report would have gone to
    tmp_path/escaped (runs/reports/../../escaped), and removed there the figures it did not
    draw. It is refused, and nothing there is touched."""
    out = _escaping_store(tmp_path, sweep_id="../../escaped")
    escaped = tmp_path / "escaped"
    escaped.mkdir()
    (escaped / "idleness.png").write_bytes(b"someone else's figure")
    line = one_line_error(capsys, ["report", *target, "--out", str(out)])
    assert "sweep id '../../escaped' cannot name a folder" in line
    assert [p.name for p in escaped.iterdir()] == ["idleness.png"]
    assert (escaped / "idleness.png").read_bytes() == b"someone else's figure"
    assert not (out / "reports").exists()


def test_a_stored_run_id_that_is_a_path_names_no_folder(tmp_path, capsys):
    out = _escaping_store(tmp_path, run_id="../escaped-run")
    line = one_line_error(capsys, ["report", "../escaped-run", "--out", str(out)])
    assert "run id '../escaped-run' cannot name a folder" in line
    assert not (out / "escaped-run").exists() and not (out / "reports").exists()


def test_a_report_removes_only_the_figures_an_earlier_report_drew(tmp_path):
    """A folder holding an earlier report (which drew idleness.png) and a figure no report
    drew there (staleness_histogram.png, someone's own): a report that draws neither removes
    the earlier report's, which would mislead, and leaves the other alone."""
    store = RunStore(tmp_path / "polyrhythm.db")
    config = make_config({"strategy": "bsp", "workers": 2, "out": str(tmp_path)})
    store.add_run("old", "2025-01-01T00:00:00+00:00", config.columns(), config.to_toml())
    store.complete_run("old", {"final_val_accuracy": 0.9, "samples_per_s": 100.0,
                               "wall_s": 5.0}, [])  # no series: those figures have no data
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "report.html").write_text("<code>idleness.png</code>")  # what drew it
    (folder / "idleness.png").write_bytes(b"an earlier report's")
    (folder / "staleness_histogram.png").write_bytes(b"someone's own")
    path = write_report(store.path, ["old"], folder, "Old")
    assert not (folder / "idleness.png").exists()
    assert (folder / "staleness_histogram.png").read_bytes() == b"someone's own"
    assert "staleness_histogram" in path.read_text()  # said to have no data, not drawn


# --- finding 6: one line for damaged files and stores ------------------------------------------

SCRIPT_FILES = [b"\xff\xfe", b"{", b"[]", b"[" * 100_000,
                b'{"script": 1, "args": [], "cwd": "."}',
                b'{"script": "a.py", "args": [2], "cwd": "."}',
                b'{"script": "a.py", "args": [], "cwd": ".", "more": 1}']


@pytest.mark.parametrize("garbage", SCRIPT_FILES)
@pytest.mark.parametrize("resuming", [resume, resume_script])
def test_a_damaged_script_json_is_a_one_line_error(tmp_path, garbage, resuming):
    record = tmp_path / "runs" / "r1"
    record.mkdir(parents=True)
    (record / "config.toml").write_text(make_config({"out": str(tmp_path)}).to_toml())
    (record / "script.json").write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        resuming("r1", tmp_path / "runs")
    assert "script.json" in one_line(info.value) and "damaged" in str(info.value)


def _damaged(tmp_path: Path, table: str, **values) -> Path:
    """The hostile store with `values` in every row of `table`."""
    out = tmp_path / "runs"
    tables = hostile.rows(out)
    for row in tables[table]:
        row.update(values)
    hostile.write_store(out, tables)
    return out


SUMMARY = hostile.summary(Path("runs"))
DAMAGED = [  # (command, table, values, what the line says)
    (["runs"], "runs", {"final_val_accuracy": "high"}, "'high' as final_val_accuracy"),
    (["runs"], "runs", {"workers": None}, "None as workers"),
    (["runs", "--json"], "runs", {"samples_per_s": b"\x00"}, "b'\\x00' as samples_per_s"),
    (["runs", "--json"], "runs", {"launcher": 5}, "5 as launcher"),
    (["simulate", "--calibrate", hostile.RUN_ID], "runs", {"summary": "{"},
     "summary is not a JSON object"),
    (["simulate", "--calibrate", hostile.RUN_ID], "runs",
     {"summary": json.dumps({k: v for k, v in SUMMARY.items() if k != "per_worker"})},
     "stored summary is damaged (KeyError: 'per_worker')"),
    (["simulate", "--calibrate", hostile.RUN_ID], "runs",
     {"summary": json.dumps(SUMMARY | {"warmup_steps": 10**15})}, "warmup_steps is"),
    (["simulate", "--calibrate", hostile.RUN_ID], "runs", {"workers": "two"},
     "'two' as workers"),
    (["train", "--compute", "emulated", "--compute-from", hostile.RUN_ID], "iterations",
     {"worker": 7}, "iterations are damaged: a row of worker 7 (of 2)"),
    (["train", "--compute", "emulated", "--compute-from", hostile.RUN_ID], "runs",
     {"workers": "two"}, "'two' as workers"),
]


@pytest.mark.parametrize("args, table, values, needle", DAMAGED)
def test_damaged_store_columns_are_one_line_errors(tmp_path, capsys, args, table, values,
                                                   needle):
    out = _damaged(tmp_path, table, **values)
    assert needle in one_line_error(capsys, [*args, "--out", str(out)])


def test_an_npz_header_that_claims_terabytes_is_refused_before_loading(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 3)})
    labels = io.BytesIO()
    np.lib.format.write_array(labels, np.zeros(4, np.int64))
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", header.getvalue() + bytes(48))
        z.writestr("y.npy", labels.getvalue())
    source = NpzSource(SimpleNamespace(data_path=str(path)))
    for read in (source.check, source.labels):
        with pytest.raises(DataError) as info:
            read()
        assert "member x.npy declares float32 data of shape (1000000000000, 3) (10.9 TiB) " \
               "but holds 48 bytes" in one_line(info.value)


def test_a_null_byte_in_out_is_a_one_line_error(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('out = "runs\\u0000x"\nepochs = 1\n')
    line = one_line_error(capsys, ["train", "--config", str(config)])
    assert "out must be a directory's path, got 'runs\\x00x' (a null byte)" in line
    with pytest.raises(ConfigError):
        RunConfig(out="a\x00b")
    with pytest.raises(StoreError, match="embedded null byte"):
        RunStore("a\x00b/polyrhythm.db").add_run("r", "now", make_config({}).columns(), "")


# --- finding 7: unbounded memory or waits ------------------------------------------------------

def test_a_sweep_of_a_trillion_points_is_refused_at_once(tmp_path):
    """10^12 combinations, or a trillion repeats: refused from the lists' lengths before a
    combination is made (it grew without end). The probe runs with its memory capped, so a
    sweep that expands is a failure here, not a machine out of memory."""
    (tmp_path / "wide.toml").write_text(
        "[grid]\n" + "\n".join(f"{key} = [{', '.join(map(str, values))}]" for key, values in {
            "lr": [0.1 * i for i in range(1, 11)], "momentum": [0.01 * i for i in range(10)],
            "weight_decay": [0.001 * i for i in range(10)], "seed": list(range(10)),
            "batch_size": [32 * i for i in range(1, 11)], "epochs": list(range(1, 11)),
            "warmup_steps": list(range(10)), "lr_decay": [0.1 * i for i in range(1, 11)],
            "lr_decay_every": list(range(10)), "val_fraction": [0.05 * i for i in range(1, 11)],
            "workers": list(range(1, 11)), "threads": list(range(1, 11))}.items()))
    (tmp_path / "long.toml").write_text("repeats = 1000000000000\n[grid]\nlr = [0.1]\n")
    result = hostile.probe(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
        from polyrhythm.cli import main
        for name in ("wide", "long"):
            main(["sweep", {str(tmp_path)!r} + "/" + name + ".toml", "--dry-run"])
        """)
    lines = result.stderr.splitlines()
    assert lines == [
        "polyrhythm: error: the grid's 1,000,000,000,000 combinations x 1 repeat are more "
        "than the 10,000 runs a sweep may plan: split it into smaller sweeps",
        "polyrhythm: error: the grid's 1 combination x 1,000,000,000,000 repeats are more "
        "than the 10,000 runs a sweep may plan: split it into smaller sweeps"], result.stderr


MAX_LINE_CHARS = 16 * 2**20  # csvfile.MAX_LINE_CHARS


def test_a_gzip_csv_of_one_endless_line_is_refused_at_its_limit(tmp_path):
    """A gzip CSV of a header and a line of more than MAX_LINE_CHARS characters (16 MiB,
    about 16 KB compressed): refused once the limit is read, not read whole (a line of
    1 GiB compresses to a MB)."""
    path = tmp_path / "endless.csv.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b"y,x\n0,1\n")
        f.write(b"1," * (MAX_LINE_CHARS // 2 + 1) + b"1\n")
    with pytest.raises(DataError) as info:
        read_table(path, "0")
    assert f"line 3 is longer than {MAX_LINE_CHARS:,} characters" in one_line(info.value)


@pytest.mark.parametrize("archive", [True, False])
def test_a_cifar_member_larger_than_its_limit_is_refused_before_it_is_read(
        tmp_path, monkeypatch, archive):
    """A member inflating past MAX_MEMBER_BYTES (the limit lowered here: the real one,
    256 MiB, is above CIFAR-100's largest member, 155 MB) is refused by the size it
    declares, not read whole: in a .tar.gz (its header) or a folder (its file)."""
    folder, tar = write_cifar(tmp_path, "cifar10", archive=False)
    (folder / "data_batch_1").write_bytes(pickle.dumps({b"pad": bytes(2 * 2**20)}))
    if archive:
        tar = tmp_path / "cifar.tar.gz"
        with tarfile.open(tar, "w:gz", compresslevel=1) as t:
            t.add(folder, arcname=folder.name)
    monkeypatch.setattr(polyrhythm.data.pickles, "MAX_MEMBER_BYTES", 2**20, raising=False)
    source = load_cifar10(SimpleNamespace(data_path=str(tar if archive else folder),
                                          augment=False), 0)
    with pytest.raises(DataError) as info:
        source.check()
    assert "data_batch_1" in one_line(info.value)
    assert "2.0 MiB, more than the 1.0 MiB" in str(info.value)
    monkeypatch.undo()
    assert polyrhythm.data.pickles.MAX_MEMBER_BYTES > 155_000_000


def _fifo_probe(path: Path, calls: list[str], imports: str) -> list[str]:
    """What each of `calls` (Python lines) says, in a process of their own, of `fifo`: a
    named pipe made at `path` that nobody writes to; a line each."""
    code = [imports, "import os", "from pathlib import Path",
            "from polyrhythm.errors import PolyrhythmError", f"fifo = Path({str(path)!r})",
            "os.mkfifo(fifo)"]
    for call in calls:
        code += ["try:", textwrap.indent(call, "    "), "except PolyrhythmError as exc:",
                 "    print(type(exc).__name__, exc)", "else:", "    print('accepted')"]
    result = hostile.probe("\n".join(code))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.splitlines()


def test_a_named_pipe_as_data_is_refused_not_waited_on(tmp_path):
    """CIFAR's reader waited for a writer forever; the CSV and npz readers' own checks
    already refused it, and still do."""
    said = _fifo_probe(tmp_path / "data", [
        f"open_source(RunConfig(dataset={name!r}, data_path=str(fifo)).data, 0).check()"
        for name in ("cifar10", "csv", "npz")],
        "from polyrhythm.config import RunConfig\n"
        "from polyrhythm.data.datasets import open_source")
    fifo = repr(str(tmp_path / "data"))
    assert said == [f"DataError cannot read data file {fifo}: it is a named pipe, not a "
                    "regular file", f"DataError data path {fifo} is not a file",
                    f"DataError data path {fifo} is not a file"], said


def test_a_named_pipe_as_config_is_refused_not_waited_on(tmp_path):
    said = _fifo_probe(tmp_path / "config.toml", ["load_config(fifo)"],
                       "from polyrhythm.config import load_config")
    assert said == [f"ConfigError cannot read config file {str(tmp_path / 'config.toml')!r}:"
                    " it is a named pipe, not a regular file"], said


def test_a_named_pipe_as_a_checkpoint_is_passed_over_not_waited_on(tmp_path):
    """A checkpoint whose worker file is a named pipe (its digest and model.pt as written):
    passed over as damaged and set aside, so resuming finds no usable checkpoint (it
    waited for a writer forever)."""
    folder = tmp_path / "checkpoints" / "epoch-0001"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"model")
    for name, data in (("model.pt", b"model"), ("worker-0.pt", b"worker")):
        (folder / f"{name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    lines = _fifo_probe(folder / "worker-0.pt", [f"latest(Path({str(tmp_path)!r}), 1, 0)"],
                        "from polyrhythm.runtime.intact import latest")
    assert "it is a named pipe, not a regular file" in lines[0], lines
    assert "set aside" in lines[0], lines
    assert lines[1].startswith("DataError no usable checkpoint"), lines


def test_a_config_larger_than_its_limit_is_refused(tmp_path):
    """A config file of more than MAX_CONFIG_BYTES (1 MiB) is no config: refused unread."""
    path = tmp_path / "config.toml"
    path.write_text("workers = 2\n" + "#" * 2**20)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "holds 1.0 MiB, more than the 1.0 MiB it may" in one_line(info.value)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="no /proc")
def test_a_file_that_holds_more_than_it_declares_is_cut_at_the_limit():
    """/proc/self/status declares 0 bytes and holds more: the limit holds while reading,
    not only by the size a file declares."""
    from polyrhythm.files import read_regular  # (here: the module is new with the fix)

    with pytest.raises(DataError, match="grew past 16 bytes while it was read"):
        read_regular("/proc/self/status", "data file", DataError, 16)
    assert read_regular("/proc/self/status", "data file", DataError, 2**20).startswith(b"Name:")
