"""Bad input: one line naming the problem on stderr, exit code 2, no traceback, no run left behind.

Each case runs the `polyrhythm` command's main (what `python -m polyrhythm.cli` exits with) in this
process, its output read at the file descriptors; a case that needs a user without root's
permission override runs the real CLI in a subprocess instead, and so do those about the
process's own end (a closed output pipe). Its --out directory is seeded beforehand with a store
holding one earlier (failed) run, so "no run left behind" is checked against a store that exists:
after the bad command the store must hold exactly that earlier row and no new run directory.
The command runs in tmp_path, so a run written to a default location would show up there too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import polyrhythm
from polyrhythm.cli import main
from polyrhythm.config import make_config
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RunStore

STRATEGY_NAMES = ["allreduce", "asp", "backup", "bsp", "dcasgd", "downpour", "dpsgd", "easgd",
                  "gossip", "kasp", "kbsp", "localsgd", "mapreduce", "reduce-broadcast", "ring",
                  "softsync", "ssp", "switch", "tree", "tree-easgd"]
MODEL_NAMES = ["cnn", "mlp"]
DATASET_NAMES = ["cifar10", "cifar100", "digits", "mnist5k", "synthetic"]
EARLIER_RUN = "20200101-000000-bsp-earlier"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A runs directory whose store already holds one earlier, failed run."""
    out = tmp_path / "store"
    config = make_config({"out": str(out), "workers": 1, "dataset": "synthetic"})
    store = RunStore(out / STORE_NAME)
    store.add_run(EARLIER_RUN, "2020-01-01T00:00:00+00:00", config.columns(), config.to_toml())
    store.fail_run(EARLIER_RUN, "an earlier failure")
    return out


@pytest.fixture
def run_train(capfd, monkeypatch):
    """`run_train(out, *args, ordinary_user=False)`: `polyrhythm train --out OUT ARGS...` run in
    OUT's parent directory, as a finished process (its exit code, stdout and stderr). The
    command's main runs in this process; with `ordinary_user`, the real CLI runs in a
    subprocess under the file permissions a user without privileges has."""
    def run(out: Path, *args: str, ordinary_user: bool = False
            ) -> subprocess.CompletedProcess[str]:
        argv = ["train", "--out", str(out), *args]
        if ordinary_user:
            return subprocess.run(as_ordinary_user([sys.executable, "-m", "polyrhythm.cli",
                                                    *argv]),
                                  cwd=out.parent, capture_output=True, text=True, timeout=120)
        monkeypatch.chdir(out.parent)
        capfd.readouterr()  # what came before is not the command's
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors exit as `python -m` would
            code = exc.code
        captured = capfd.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)
    return run


def as_ordinary_user(command: list[str]) -> list[str]:
    """`command`, held to file permissions even when the suite runs as root (as CI does), so
    the permission cases check what a user sees instead of being skipped. Root passes every
    permission check through two capabilities, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH;
    setpriv (util-linux) drops both for the command and all it starts. It stays root, the
    owner of the files the test made and of the interpreter wherever that is installed; an
    unprivileged user such as nobody may not read the interpreter (this machine's Python and
    its libpython are under /root, mode 700)."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("the suite runs as root and has no setpriv (util-linux) to drop root's "
                    "permission override for this case: install util-linux")
    drop = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}", *command]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code 2, stdout empty, stderr exactly one non-empty line containing every needle."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == 2, output
    assert proc.stdout == "", output
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{proc.stderr}"
    line = lines[0]
    assert line.startswith("polyrhythm") and "error:" in line, line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def assert_no_run_left(out: Path) -> None:
    """Only the seeded earlier run is stored; no run directory or stray `runs/` was created."""
    rows = RunStore(out / STORE_NAME).runs()
    assert [r["status"] for r in rows if r["status"] == "running"] == []
    assert [(r["run_id"], r["status"]) for r in rows] == [(EARLIER_RUN, "failed")]
    assert sorted(p.name for p in out.iterdir()) == [STORE_NAME]
    assert not (out.parent / "runs").exists()


def write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


# --- bad flags ---------------------------------------------------------------------------------

FLAG_CASES = [
    pytest.param(["--strategy", "telepathy"],
                 ["unknown strategy", "'telepathy'", *STRATEGY_NAMES],
                 id="unknown-strategy"),
    pytest.param(["--model", "resnet999"], ["unknown model", "'resnet999'", *MODEL_NAMES],
                 id="unknown-model"),
    pytest.param(["--dataset", "imagenet"], ["unknown dataset", "'imagenet'", *DATASET_NAMES],
                 id="unknown-dataset"),
    pytest.param(["--workers", "0"], ["workers must be at least 1", "got 0"], id="workers-0"),
    pytest.param(["--strategy", "bsp", "--servers", "0"],
                 ["'bsp'", "at least 1 server", "got 0"], id="ps-strategy-0-servers"),
    pytest.param(["--strategy", "ssp", "--staleness", "-1"],
                 ["staleness must be at least 0", "got -1"], id="negative-staleness"),
    pytest.param(["--workers", "4", "--batch-size", "3"],
                 ["batch size 3", "smaller than the worker count 4"], id="batch-below-workers"),
    pytest.param(["--workers", "two"], ["--workers", "invalid int value", "'two'"],
                 id="workers-not-an-int"),
    pytest.param(["--dataset", "cifar10"], ["'cifar10'", "needs --data-path"],
                 id="cifar-without-data-path"),
    pytest.param(["--data-path", "/tmp"], ["'mnist5k' takes no --data-path", "cifar10, cifar100"],
                 id="data-path-for-packaged-dataset"),
    pytest.param(["--allreduce-servers", "1"], ["unrecognized arguments"], id="unknown-flag"),
    pytest.param(["--strategy", "kbsp", "--workers", "4", "--quorum", "5"],
                 ["quorum must be between 1 and the worker count 4", "got 5"],
                 id="quorum-above-workers"),
    pytest.param(["--strategy", "kasp", "--quorum", "0"], ["quorum must be between 1"],
                 id="quorum-0"),
    pytest.param(["--strategy", "localsgd", "--tau", "0"], ["tau must be at least 1", "got 0"],
                 id="tau-0"),
    pytest.param(["--strategy", "easgd", "--alpha", "1.5"], ["alpha must be in (0, 1]"],
                 id="alpha-above-1"),
    pytest.param(["--strategy", "backup", "--workers", "2", "--backup", "2"],
                 ["backup must be at least 1 and below the worker count 2", "got 2"],
                 id="backup-as-many-as-workers"),
    pytest.param(["--strategy", "gossip", "--gossip-p", "0"], ["gossip_p must be in (0, 1]"],
                 id="gossip-p-0"),
    pytest.param(["--strategy", "ssp", "--value-bound", "-1"], ["value_bound must be positive"],
                 id="negative-value-bound"),
    pytest.param(["--strategy", "downpour", "--push-every", "0"],
                 ["push_every must be at least 1"], id="push-every-0"),
    pytest.param(["--strategy", "softsync", "--lr-floor", "2"], ["lr_floor must be in (0, 1]"],
                 id="lr-floor-above-1"),
    pytest.param(["--strategy", "bsp", "--tau", "4"],
                 ["strategy 'bsp' takes no --tau", "its parameters: none"],
                 id="parameter-of-another-strategy"),
    pytest.param(["--strategy", "kbsp", "--servers", "2"],
                 ["'kbsp' decides on whole gradients", "1 server, got 2"],
                 id="quorum-on-two-servers"),
    pytest.param(["--strategy", "ssp", "--value-bound", "0.1", "--bucket-kb", "64"],
                 ["'ssp' takes no --bucket-kb", "whole gradients"],
                 id="value-bound-with-buckets"),
    pytest.param(["--strategy", "ring", "--bucket-kb", "64"],
                 ["'ring' takes no --bucket-kb", "no servers"], id="buckets-without-servers"),
    pytest.param(["--workers", "4", "--slowdown", "1", "1", "3"],
                 ["slowdown needs one value per worker (4), got 3"], id="slowdown-too-short"),
    pytest.param(["--workers", "2", "--worker-delay-s", "0,0.1,0"],
                 ["worker_delay_s needs one value per worker (2), got 3"],
                 id="worker-delay-too-long"),
    pytest.param(["--strategy", "kbsp", "--staleness", "2"],
                 ["strategy 'kbsp' takes no --staleness", "--quorum"],
                 id="staleness-for-kbsp"),
    pytest.param(["--strategy", "switch", "--from", "ring", "--to", "ssp", "--staleness", "2",
                  "--at", "0.3"],
                 ["⌊0.9⌋ = 0 epochs", "ring would never run", "at least 4 epochs"],
                 id="switch-before-training"),
    pytest.param(["--model", "resnet20", "--dataset", "synthetic", "--synthetic-shape", "20"],
                 ["model resnet20 needs image samples", "dataset gives shape (20,)"],
                 id="image-model-on-feature-vectors"),
    # A user's functions the ranks could not import: caught by the launcher, not by a rank.
    pytest.param(["--model", "no_such_module:net"],
                 ["cannot load 'no_such_module:net'", "No module named"],
                 id="model-not-importable"),
    pytest.param(["--sharding", "no_such_module:split"],
                 ["cannot load 'no_such_module:split'", "No module named"],
                 id="splitter-not-importable"),
    pytest.param(["--sharding", "polyrhythm.data.splitters:SPLITTERS"],
                 ["sharding 'polyrhythm.data.splitters:SPLITTERS' is not a function"],
                 id="splitter-not-a-function"),
    pytest.param(["--compress", "topk", "--ratio", "0"], ["ratio must be in (0, 1], got 0.0"],
                 id="compress-ratio-zero"),
    pytest.param(["--compress", "randomk", "--ratio", "1.5"],
                 ["ratio must be in (0, 1], got 1.5"], id="compress-ratio-above-one"),
    pytest.param(["--compress", "zip"], ["unknown compressor 'zip'", "powersgd"],
                 id="unknown-compressor"),
    pytest.param(["--compress", "fp16", "--ratio", "0.1"],
                 ["compressor 'fp16' takes no --ratio", "--ratio is for randomk, topk"],
                 id="parameter-of-another-compressor"),
    pytest.param(["--strategy", "allreduce", "--compress", "topk", "--compress-replies"],
                 ["compress_replies compresses parameter servers' replies",
                  "allreduce has no servers"], id="compressed-replies-without-servers"),
    pytest.param(["--strategy", "ssp", "--value-bound", "0.1", "--compress", "topk",
                  "--compress-replies"],
                 ["compress_replies cannot go with value_bound"],
                 id="compressed-replies-with-a-value-bound"),
    pytest.param(["--error-feedback"], ["error_feedback needs a compressor"],
                 id="error-feedback-without-compression"),
    pytest.param(["--compress", "qsgd", "--levels", "0"], ["levels must be at least 1"],
                 id="qsgd-without-levels"),
]


@pytest.mark.parametrize(("args", "needles"), FLAG_CASES)
def test_bad_flag(run_train, out: Path, args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_train(out, *args), *needles)
    assert_no_run_left(out)
    assert_no_run_left(out)


def test_unknown_strategy_lists_each_valid_name_once(run_train, out: Path) -> None:
    line = assert_one_line_error(run_train(out, "--strategy", "telepathy"))
    listed = line.split("valid:", 1)[1]
    assert sorted(name.strip() for name in listed.split(",")) == STRATEGY_NAMES


def test_missing_data_path(run_train, out: Path) -> None:
    missing = out.parent / "no-such-cifar"
    proc = run_train(out, "--dataset", "cifar10", "--data-path", str(missing))
    assert_one_line_error(proc, str(missing), "does not exist")
    assert_no_run_left(out)


def test_data_path_not_an_archive(run_train, out: Path) -> None:
    junk = write(out.parent / "cifar.tar.gz", b"not a tar archive")
    proc = run_train(out, "--dataset", "cifar10", "--data-path", str(junk))
    assert_one_line_error(proc, str(junk))
    assert_no_run_left(out)


def test_image_model_on_an_npz_of_feature_vectors(run_train, out: Path) -> None:
    """Caught before launch from the file's arrays, as for any data set."""
    data = out.parent / "vectors.npz"
    np.savez(data, x=np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32),
             y=np.arange(40) % 4)
    proc = run_train(out, "--dataset", "npz", "--data-path", str(data), "--model", "resnet20")
    assert_one_line_error(proc, "model resnet20 needs image samples", "shape (8,)")
    assert_no_run_left(out)


CSV_CASES = [  # every bad file's own line: test_csv.py
    pytest.param("1,2,3\n4,x,6\n", [], ["line 2, column 1: 'x' is not a number"],
                 id="non-numeric"),
    pytest.param("1,2,3\n4,5\n", [], ["line 2 has 2 columns, the first row 3"], id="ragged"),
    pytest.param("1,2,3\n4,5,6\n", ["--target", "7"], ["has no column 7"], id="no-target"),
    pytest.param("1,2,3\n0.5,5,6\n", [], ["loss cross_entropy needs class ids",
                                         "example 2 has target 0.5"], id="not-a-class"),
    pytest.param("1,2,3\n0,5,6\n", ["--loss", "bce", "--standardise-target"],
                 ["--standardise-target is for --loss mse only"], id="scaled-classes"),
]


@pytest.mark.parametrize(("text", "args", "needles"), CSV_CASES)
def test_bad_csv_data(run_train, out: Path, text: str, args: list[str],
                      needles: list[str]) -> None:
    data = write(out.parent / "table.csv", text)
    proc = run_train(out, "--dataset", "csv", "--data-path", str(data), *args)
    assert_one_line_error(proc, *needles)
    assert_no_run_left(out)


# --- bad config files --------------------------------------------------------------------------

CONFIG_CASES = [
    pytest.param("workers = 2\nepoch = 1\n", ["unknown config key 'epoch'"],
                 id="unknown-key"),
    pytest.param("workers = 2\nbatch_size = \n", ["invalid TOML", "bad.toml", "line 2"],
                 id="invalid-toml"),
    pytest.param('workers = "many"\n', ["workers", "valid integer"], id="wrong-value-type"),
    pytest.param("[train]\nworkers = 2\n", ["unknown config key 'train'"], id="nested-table"),
]


@pytest.mark.parametrize(("text", "needles"), CONFIG_CASES)
def test_bad_config_file(run_train, out: Path, text: str, needles: list[str]) -> None:
    config = write(out.parent / "bad.toml", text)
    assert_one_line_error(run_train(out, "--config", str(config)), *needles)
    assert_no_run_left(out)


def test_config_file_that_does_not_exist(run_train, out: Path) -> None:
    missing = out.parent / "nowhere.toml"
    proc = run_train(out, "--config", str(missing))
    assert_one_line_error(proc, "cannot read config file", str(missing), "No such file")
    assert_no_run_left(out)


def test_config_path_is_a_directory(run_train, out: Path) -> None:
    directory = out.parent / "conf.toml"
    directory.mkdir()
    proc = run_train(out, "--config", str(directory))
    assert_one_line_error(proc, "cannot read config file", str(directory), "directory")
    assert_no_run_left(out)


def test_config_file_without_read_permission(run_train, out: Path) -> None:
    config = write(out.parent / "secret.toml", "workers = 2\n")
    config.chmod(0)
    proc = run_train(out, "--config", str(config), ordinary_user=True)
    assert_one_line_error(proc, "cannot read config file", str(config), "Permission denied")
    assert_no_run_left(out)


def test_config_file_not_utf8(run_train, out: Path) -> None:
    config = write(out.parent / "latin1.toml", 'model = "caf\xe9"\n'.encode("latin-1"))
    proc = run_train(out, "--config", str(config))
    assert_one_line_error(proc, str(config))
    assert_no_run_left(out)


def test_error_names_the_flag_value_that_overrides_the_config(run_train, out: Path) -> None:
    """Flags win over the file: the problem reported is the flags' one, with their numbers."""
    config = write(out.parent / "bad.toml", "workers = 0\nbatch_size = 64\n")
    proc = run_train(out, "--config", str(config), "--workers", "4", "--batch-size", "3")
    assert_one_line_error(proc, "batch size 3 is smaller than the worker count 4")
    assert_no_run_left(out)


# --- a runs directory or store that cannot take the run -----------------------------------------

QUICK_RUN = ("--workers", "1", "--dataset", "synthetic", "--epochs", "1")


@contextlib.contextmanager
def permissions(path: Path, mode: int) -> Iterator[None]:
    """`path` with permission bits `mode` inside the block, and its own again after."""
    own = path.stat().st_mode & 0o777
    path.chmod(mode)
    try:
        yield
    finally:
        path.chmod(own)


def test_runs_directory_without_write_permission(run_train, out: Path) -> None:
    with permissions(out, 0o555):
        proc = run_train(out, *QUICK_RUN, ordinary_user=True)
    assert_one_line_error(proc, "cannot write run directory", str(out), "Permission denied")
    assert_no_run_left(out)


def test_store_without_write_permission_leaves_no_run_directory(run_train,
                                                                out: Path) -> None:
    """The directory takes the run's files, the store refuses its row: the files go too."""
    store = out / STORE_NAME
    with permissions(store, 0o444):
        proc = run_train(out, *QUICK_RUN, ordinary_user=True)
    assert_one_line_error(proc, "run store", str(store), "readonly database")
    # The seeded run alone, and no directory; SQLite's own -wal and -shm files may stay
    # beside a store it could open only to read.
    assert [r["run_id"] for r in RunStore(store).runs()] == [EARLIER_RUN]
    assert {p.name for p in out.iterdir()} <= {STORE_NAME, f"{STORE_NAME}-wal",
                                              f"{STORE_NAME}-shm"}


def test_store_that_is_not_a_database_leaves_no_run_directory(run_train,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "store"
    out.mkdir()
    write(out / STORE_NAME, "this is not sqlite\n")
    proc = run_train(out, *QUICK_RUN)
    assert_one_line_error(proc, "run store", str(out / STORE_NAME), "not a database")
    assert sorted(p.name for p in out.iterdir()) == [STORE_NAME]


# --- the Python API and the strategy list ------------------------------------------------------

def test_api_raises_config_error_for_unknown_strategy(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with pytest.raises(polyrhythm.ConfigError) as info:
        polyrhythm.train(strategy="telepathy", out=str(out))
    message = str(info.value)
    assert "\n" not in message
    assert "unknown strategy 'telepathy'" in message
    assert all(name in message for name in STRATEGY_NAMES), message
    assert info.value.exit_code == 2
    assert isinstance(info.value, polyrhythm.PolyrhythmError)
    assert not out.exists()


def test_strategies_command_lists_every_strategy() -> None:
    proc = subprocess.run([sys.executable, "-m", "polyrhythm.cli", "strategies"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    names = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert sorted(names) == STRATEGY_NAMES
    # Each strategy's parameters follow it, indented, with their defaults.
    parameters: dict[str, list[str]] = {}
    after_a_loss: dict[str, str] = {}  # then what a worker lost does to its run
    current = ""
    for line in lines:
        if line.startswith("    a worker lost "):
            after_a_loss[current] = line.split("a worker lost", 1)[1].strip()
        elif line.startswith(" "):
            parameters[current].append(line.split()[0])
        else:
            current = line.split()[0]
            parameters[current] = []
    assert sorted(after_a_loss) == STRATEGY_NAMES
    assert after_a_loss["asp"].startswith("the others go on without it")
    assert after_a_loss["bsp"].endswith("with --on-worker-failure continue the others go on")
    assert after_a_loss["allreduce"].endswith("the others regroup from the step it was found "
                                              "gone: their sums, averages and rings over the "
                                              "workers left, their gossip and tree neighbours "
                                              "without it (worker 0 records the run: its loss "
                                              "still fails it)")
    assert after_a_loss["tree-easgd"].endswith("worker 0 records the run: its loss still "
                                               "fails it)")
    assert "Spark run is started afresh" in after_a_loss["mapreduce"]
    assert parameters["ssp"] == ["--staleness", "--value-bound"]
    assert parameters["kbsp"] == ["--quorum"]
    assert parameters["easgd"] == ["--tau", "--alpha"]
    assert parameters["bsp"] == parameters["allreduce"] == []
    assert "(default: 3)" in next(line for line in lines if "--staleness" in line)


@pytest.mark.parametrize("args", [["strategies"], ["models"], ["datasets"], ["runs"],
                                  ["runs", "--json"]], ids=" ".join)
def test_a_closed_output_pipe_is_a_quiet_end(out: Path, args: list[str]) -> None:
    # `polyrhythm strategies | head`: the reader is gone. Its end is closed before the command
    # starts, so every write fails, the listing's (over a pipe's buffer) during a print and
    # the runs' (one earlier run, a few lines) at the last flush.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "polyrhythm.cli", *args,
             *(["--out", str(out)] if args[0] == "runs" else [])],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
