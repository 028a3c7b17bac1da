"""Sweeps, comparisons and reports: grid expansion, validation, resuming, failures, reports."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from helpers import HANG_GUARD_S, give_up, rank_processes
from polyrhythm.cli import main
from polyrhythm.errors import ConfigError, RunFailed
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RunStore
from polyrhythm.sweep import (
    SweepStore,
    expand_grid,
    format_outcome,
    load_sweep,
    parse_sweep,
    run_sweep,
)

EXPERIMENTS = Path(__file__).parent.parent / "experiments"
QUICK = {"dataset": "digits", "epochs": 1, "steps_per_epoch": 3, "workers": 1}


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "polyrhythm.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def write_sweep(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def labels(points) -> list[str]:
    return [p.label for p in points]


# --- the grid, pure ----------------------------------------------------------------------

def test_grid_is_every_combination_in_grid_order():
    points = expand_grid({"epochs": 2}, {"strategy": ["bsp", "asp"], "batch_size": [32, 64]})
    assert labels(points) == ["bsp batch_size=32", "bsp batch_size=64", "asp batch_size=32",
                              "asp batch_size=64"]
    assert points[0].fields == {"epochs": 2, "strategy": "bsp", "batch_size": 32}


def test_parameters_a_strategy_does_not_read_are_dropped_and_the_same_point_runs_once():
    points = expand_grid({}, {"strategy": ["bsp", "localsgd"], "tau": [2, 8]})
    assert labels(points) == ["bsp", "localsgd tau=2", "localsgd tau=8"]
    assert "tau" not in points[0].fields


def test_servers_and_buckets_are_dropped_where_they_are_not_read():
    points = expand_grid({"bucket_kb": 64}, {"strategy": ["bsp", "kbsp", "allreduce"],
                                             "servers": [1]})
    assert [p.fields for p in points] == [
        {"bucket_kb": 64, "strategy": "bsp", "servers": 1},
        {"strategy": "kbsp", "servers": 1},  # pushes whole gradients: one bucket
        {"strategy": "allreduce"}]  # no servers


def test_a_linked_axis_sets_several_fields_together():
    points = expand_grid({}, {"scale": [{"workers": 1, "worker_delay_s": [0.1]},
                                        {"workers": 2, "worker_delay_s": [0.05, 0.05]}]})
    assert labels(points) == ["bsp workers=1 worker_delay_s=[0.1]",
                              "bsp workers=2 worker_delay_s=[0.05,0.05]"]


def test_a_field_no_strategy_reads_is_an_error():
    with pytest.raises(ConfigError, match="tau is read by none of this sweep's strategies"):
        expand_grid({"tau": 2}, {"strategy": ["bsp", "asp"]})


def test_point_keys_do_not_depend_on_field_order_and_repeats_shift_the_seed(tmp_path):
    a = parse_sweep({"repeats": 2, "base": {"seed": 5, "epochs": 1}, "grid": {"lr": [0.1]}},
                    out=str(tmp_path))
    b = parse_sweep({"repeats": 2, "base": {"epochs": 1, "seed": 5}, "grid": {"lr": [0.1]}},
                    out=str(tmp_path))
    assert a.points[0].key == b.points[0].key
    assert [r.config.seed for r in a.plan()] == [5, 6]
    assert all(r.config.out == str(tmp_path) for r in a.plan())


def test_a_base_in_sections_is_read_as_flat_fields(tmp_path):
    # A stored config.toml (in sections) can be a sweep's base.
    base = {"epochs": 1, "strategy": {"name": "localsgd", "tau": 2}, "data": {"name": "digits"}}
    sweep = parse_sweep({"base": base, "grid": {"seed": [1, 2]}}, out=str(tmp_path))
    assert [p.fields for p in sweep.points] == [
        {"epochs": 1, "strategy": "localsgd", "tau": 2, "dataset": "digits", "seed": s}
        for s in (1, 2)]


def test_a_grid_of_lists_as_strategy_names_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="strategy must be a valid string"):
        parse_sweep({"grid": {"strategy": [["bsp"]]}}, out=str(tmp_path))


def test_sweep_id_is_the_slug_of_the_name(tmp_path):
    sweep = parse_sweep({"name": "Sync vs. Async!", "grid": {"lr": [0.1]}})
    assert sweep.sweep_id == "sync-vs-async"
    assert sweep.out == Path("runs")


# --- bad input: one line, exit 2, nothing run ----------------------------------------------

BAD_SWEEPS = {
    "empty grid": ('name = "x"\n[base]\nepochs = 1\n[grid]\n', "the grid is empty"),
    "unknown field": ('[grid]\nbatchsize = [32]\n', "unknown field 'batchsize' in [grid]"),
    "non-list grid value": ('[grid]\nbatch_size = 32\n', "grid.batch_size must be a list"),
    "repeats below 1": ('repeats = 0\n[grid]\nlr = [0.1]\n', "repeats must be"),
    "bad point": ('[base]\nworkers = 4\n[grid]\nstrategy = ["kbsp"]\nquorum = [2, 5]\n',
                  "point kbsp quorum=5: quorum must be between 1 and the worker count 4"),
    # checked in-process (main), to spare a process start each
    "no grid": ('name = "x"\n', "the grid is empty"),
    "unknown field in base": ('[base]\nepoch = 1\n[grid]\nlr = [0.1]\n',
                              "unknown field 'epoch' in [base]"),
    "unknown key": ('nmae = "x"\n[grid]\nlr = [0.1]\n', "unknown key 'nmae'"),
    "list field": ('[grid]\nworker_delay_s = [0.1]\n', "grid.worker_delay_s takes a list of"),
    "two entries set a field": ('[grid]\nworkers = [1]\nscale = [{workers = 2}]\n',
                                "workers is set by two grid entries"),
    "out in the grid": ('[grid]\nout = ["a", "b"]\n', "out cannot vary in the grid"),
}
IN_A_PROCESS = ["empty grid", "unknown field", "non-list grid value", "repeats below 1",
                "bad point"]


def seeded_store(out: Path) -> Path:
    """A runs directory whose store knows one sweep, 'known'."""
    sweep = parse_sweep({"name": "known", "grid": {"lr": [0.1]}}, out=str(out))
    SweepStore(sweep.store_path).begin(sweep, sweep.plan())
    return out


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """The bad commands of the spec, started in parallel (each pays Python's and torch's
    start-up); the store of the last one already exists."""
    tmp = tmp_path_factory.mktemp("bad")
    out = tmp / "runs"
    commands = {name: ["sweep", str(write_sweep(tmp / f"{i}.toml", BAD_SWEEPS[name][0])),
                       "--out", str(out)] for i, name in enumerate(IN_A_PROCESS)}
    known = seeded_store(tmp / "known")
    commands["unknown sweep id"] = ["report", "--sweep", "nope", "--out", str(known)]
    procs = {name: cli(*args, cwd=tmp) for name, args in commands.items()}
    try:
        results = {name: (p.wait(timeout=120), *p.communicate()) for name, p in procs.items()}
    finally:  # a hung command fails the tests, and none is left running
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out, results


@pytest.mark.parametrize("case, needle", [
    *((name, BAD_SWEEPS[name][1]) for name in IN_A_PROCESS),
    ("unknown sweep id", "unknown sweep id 'nope' in"),
])
def test_bad_input_is_one_line_with_exit_2_and_runs_nothing(bad_runs, case, needle):
    out, results = bad_runs
    code, stdout, stderr = results[case]
    assert code == 2, stderr
    assert stdout == ""
    assert "Traceback" not in stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith("polyrhythm: error:") and needle in stderr, stderr
    assert not out.exists()


@pytest.mark.parametrize("case", [name for name in BAD_SWEEPS if name not in IN_A_PROCESS])
def test_more_bad_sweep_files(tmp_path, capsys, case):
    text, needle = BAD_SWEEPS[case]
    path = write_sweep(tmp_path / "bad.toml", text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, needle", [
    (["compare", "--repeats", "0"], "repeats must be a whole number of at least 1, got 0"),
    (["compare", "--strategies", "bsp,nope"], "point nope: unknown strategy 'nope'"),
    (["compare", "--strategies", ","], "--strategies is empty"),
    (["compare", "--quorum", "2"], "quorum is read by none of this sweep's strategies"),
    (["sweep", "x.toml", "--id", "a/b"], "sweep id 'a/b' cannot name a folder: it must be letters"),
    (["report", "--latest"], "no run store at"),
])
def test_bad_commands(tmp_path, capsys, args, needle):
    write_sweep(tmp_path / "x.toml", "[grid]\nlr = [0.1]\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert main([*args, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "runs").exists()


def test_report_needs_one_of_run_ids_sweep_or_latest(tmp_path, capsys):
    out = seeded_store(tmp_path)
    assert main(["report", "--out", str(out)]) == 2
    assert "give run ids, --sweep SWEEP_ID or --latest" in capsys.readouterr().err


def test_dry_run_lists_the_runs_and_runs_nothing(tmp_path, capsys):
    path = write_sweep(tmp_path / "s.toml", 'name = "dry"\nrepeats = 2\n[grid]\n'
                       'strategy = ["bsp", "localsgd"]\ntau = [2, 8]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 points x 2 repeats = 6 runs" in out
    assert "[6/6] localsgd tau=8 seed=1: to run" in out
    assert not (tmp_path / "runs").exists()


# --- running, with a stand-in for train ----------------------------------------------------

def stand_in_train(fail: dict[str, str], interrupt: str | None = None):
    """A train() that stores a completed run, or raises RunFailed as the launcher does: for
    the strategies in fail, and for `interrupt` as if Ctrl-C stopped it."""
    def train(config):
        run_id = f"r-{config.strategy.name}-{config.seed}"
        if config.strategy.name in fail:
            raise RunFailed(f"run {run_id} {fail[config.strategy.name]}", run_id)
        if config.strategy.name == interrupt:
            raise RunFailed(f"run {run_id} interrupted", run_id, interrupted=True)
        store = RunStore(Path(config.out) / STORE_NAME)
        store.add_run(run_id, "2026-01-01T00:00:00+00:00", config.columns(), config.to_toml())
        store.complete_run(run_id, {"final_val_accuracy": 0.5, "samples_per_s": 100.0,
                                    "wall_s": 1.0}, [])
        return {"run_id": run_id, "final_val_accuracy": 0.5}
    return train


def test_a_failed_run_does_not_stop_the_others_and_runs_again_next_time(tmp_path):
    sweep = parse_sweep({"name": "f", "grid": {"strategy": ["bsp", "asp", "allreduce"]}},
                        out=str(tmp_path))
    crash = "failed: rank 1 (worker 0) was killed by SIGKILL"
    log = io.StringIO()
    outcome = run_sweep(sweep, train=stand_in_train({"asp": crash}), stream=log)
    assert outcome.run_ids == ["r-bsp-0", "r-allreduce-0"]
    assert outcome.failures == [("asp seed=0", f"run r-asp-0 {crash}")]
    assert "[2/3] asp seed=0: failed: run r-asp-0" in log.getvalue()
    assert "[3/3] allreduce seed=0: 0.500 acc" in log.getvalue()
    (failed,) = [r for r in SweepStore(sweep.store_path).rows("f") if r["status"] == "failed"]
    assert failed["run_id"] == "r-asp-0" and failed["error"] == f"run r-asp-0 {crash}"
    text = format_outcome(outcome)
    assert "3 runs, 2 completed (0 earlier), 1 failed" in text
    assert f"  asp seed=0: run r-asp-0 {crash}" in text

    again = run_sweep(sweep, train=stand_in_train({}), stream=io.StringIO())
    assert (again.earlier, again.ran, again.failures) == (2, 1, [])
    assert again.run_ids == ["r-bsp-0", "r-asp-0", "r-allreduce-0"]


def test_an_interrupted_run_stops_the_sweep_and_is_recorded_as_failed(tmp_path):
    sweep = parse_sweep({"name": "i", "grid": {"strategy": ["bsp", "asp", "allreduce"]}},
                        out=str(tmp_path))
    train = stand_in_train({}, interrupt="asp")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, train=train, stream=io.StringIO())
    rows = {r["point_key"]: r["status"] for r in SweepStore(sweep.store_path).rows("i")}
    assert sorted(rows.values()) == ["completed", "failed"]  # allreduce never started


def test_a_bug_stops_the_sweep_with_its_traceback_and_its_run_is_recorded_as_failed(tmp_path):
    sweep = parse_sweep({"name": "b", "grid": {"strategy": ["bsp", "asp"]}}, out=str(tmp_path))

    def train(config):
        raise ValueError("a bug in train")

    with pytest.raises(ValueError, match="a bug in train"):  # itself, traceback and all
        run_sweep(sweep, train=train, stream=io.StringIO())
    (row,) = SweepStore(sweep.store_path).rows("b")  # not left "running"
    assert row["status"] == "failed" and row["error"] == "ValueError: a bug in train"


# --- real runs -----------------------------------------------------------------------------

def completed_rows(out: Path, sweep_id: str) -> list[dict]:
    rows = SweepStore(out / STORE_NAME).rows(sweep_id) if (out / STORE_NAME).exists() else []
    return [r for r in rows if r["status"] == "completed"]


def test_a_killed_sweep_restarts_with_only_the_missing_runs(tmp_path, capsys):
    # Each run trains for 1.2 s (3 steps of 0.4 s emulated compute): long enough to be
    # killed in, since a rank starts in milliseconds.
    slow = {**QUICK, "worker_delay_s": [0.4]}
    path = write_sweep(tmp_path / "resume.toml", "\n".join(
        ['name = "resume"', "repeats = 2", "[base]", *(f"{k} = {json.dumps(v)}"
                                                      for k, v in slow.items()),
         "[grid]", 'strategy = ["allreduce", "localsgd"]', ""]))
    out = tmp_path / "runs"
    first = cli("sweep", str(path), "--out", str(out))
    deadline = time.monotonic() + HANG_GUARD_S
    # Kill once 2 runs completed and the next run's rank is up: a rank still starting could
    # miss its parent's death (it binds to it when it is up) and outlive the sweep.
    while len(completed_rows(out, "resume")) < 2 or not (ranks := rank_processes(first.pid)):
        if first.poll() is not None or time.monotonic() > deadline:
            give_up(first, "2 completed runs and the third's rank", HANG_GUARD_S)
        time.sleep(0.05)
    first.kill()
    first.communicate()
    _, alive = psutil.wait_procs(list(ranks.values()), timeout=HANG_GUARD_S)
    assert alive == [], "a rank outlived the killed sweep"
    earlier = len(completed_rows(out, "resume"))
    assert earlier in (2, 3)

    # Restarted by the command's main, in this process.
    code = main(["sweep", str(path), "--out", str(out), "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    result = json.loads(stdout.splitlines()[-1])
    assert (result["earlier"], result["ran"], result["completed"]) == (earlier, 4 - earlier, 4)
    completed = {r["run_id"] for r in RunStore(out / STORE_NAME).runs()
                 if r["status"] == "completed"}
    assert len(completed) == 4 and set(result["run_ids"]) == completed
    rows = completed_rows(out, "resume")
    assert len({(r["point_key"], r["repeat"]) for r in rows}) == len(rows) == 4


def fake_cifar10(directory: Path, per_batch: int = 8) -> Path:
    """A tiny CIFAR-10 in the python-pickle layout: 5 training batches and a test batch."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(x) for x in rng.integers(0, 10, per_batch)]}
        (directory / name).write_bytes(pickle.dumps(batch))
    return directory


def test_a_point_that_fails_at_run_time_leaves_the_others_and_exits_1(tmp_path, capfd):
    good = fake_cifar10(tmp_path / "cifar")
    bad = tmp_path / "not-an-archive.tar.gz"
    bad.write_text("no archive here")
    path = write_sweep(tmp_path / "fails.toml", "\n".join([
        'name = "fails"', "[base]", 'dataset = "cifar10"', 'strategy = "allreduce"',
        "workers = 1", "epochs = 1", "batch_size = 8", "[grid]",  # 40 training images
        f"data_path = [{json.dumps(str(bad))}, "
        f"{json.dumps(str(good))}]", ""]))
    out = tmp_path / "runs"
    code = main(["sweep", str(path), "--out", str(out)])  # the command, in this process
    stdout, stderr = capfd.readouterr()
    assert code == 1, stderr
    assert "Traceback" not in stdout + stderr
    assert "2 runs, 1 completed (0 earlier), 1 failed" in stdout
    assert "neither a complete tar archive nor a directory" in stdout.split("failed:\n", 1)[1]
    assert "[1/2]" in stderr and "[2/2]" in stderr
    (run,) = RunStore(out / STORE_NAME).runs()
    assert run["status"] == "completed"


def test_compare_writes_a_report_and_report_rewrites_it(tmp_path, capsys):
    out = tmp_path / "runs"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in QUICK.items()]
    code = main(["compare", "--strategies", "allreduce,localsgd", "--id", "cmp", *flags,
                 "--out", str(out), "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    result = json.loads(stdout.splitlines()[-1])
    assert result["sweep_id"] == "cmp" and result["completed"] == 2
    assert (out / "sweeps" / "cmp" / "sweep.toml").exists()
    assert load_sweep(out / "sweeps" / "cmp" / "sweep.toml").sweep_id == "cmp"
    report = Path(result["report"])
    assert report.is_file() and report.parent == out / "sweeps" / "cmp"

    assert main(["report", "--latest", "--format", "md", "--out", str(out)]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert written.is_file() and written.parent == out / "reports" / "cmp"
    assert main(["report", result["run_ids"][0], "--out", str(out)]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert written.is_file() and written.parent == out / "reports" / result["run_ids"][0]


# --- the ready sweep files -----------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_experiment_file_parses_and_every_point_is_valid(path):
    header = path.read_text().splitlines()[0]
    assert header.startswith("# "), "each file opens with a comment: study and duration"
    sweep = load_sweep(path)
    assert sweep.sweep_id == path.stem
    # Sized for a 2-core machine; the largest is compression.toml's 3 setups x 5 compressors
    # x 3 repeats, as the study asks (about 40 minutes).
    assert 2 <= len(sweep.plan()) <= 45


def test_the_experiments_are_there():
    assert len(list(EXPERIMENTS.glob("*.toml"))) >= 8


def test_a_per_worker_list_follows_the_workers_of_its_point(tmp_path):
    # Linked to the workers, each point's list fits; left in the base, a point it does not
    # fit is refused before anything runs, naming the point.
    linked = parse_sweep({"base": {"strategy": "asp"}, "grid": {"scale": [
        {"workers": 2, "slowdown": [1.0, 3.0]}, {"workers": 3, "slowdown": [1.0, 1.0, 3.0]}]}},
        out=str(tmp_path))
    assert [len(run.config.slowdown) for run in linked.plan()] == [2, 3]
    with pytest.raises(ConfigError) as info:
        parse_sweep({"base": {"slowdown": [1.0, 3.0]}, "grid": {"workers": [2, 3]}},
                    out=str(tmp_path))
    assert str(info.value) == ("sweep 'sweep', point bsp workers=3: slowdown needs one value "
                               "per worker (3), got 2")


def test_compare_takes_its_strategies_as_every_list_flag_takes_a_list():
    from polyrhythm.cli import build_parser

    parser = build_parser()
    for words in (["bsp", "asp", "ssp"], ["bsp,asp", "ssp"], ["bsp, asp,ssp"]):
        assert parser.parse_args(["compare", "--strategies", *words]).strategies == [
            "bsp", "asp", "ssp"]
    assert parser.parse_args(["compare"]).strategies is None  # the default five
    assert parser.parse_args(["train", "--slowdown", "1", "1,1", " 3"]).slowdown == [1, 1, 1, 3]


# --- a sweep over a user's script ---------------------------------------------------------

def test_a_sweep_runs_a_users_script_at_every_point(tmp_path):
    """script = a training script (relative to the sweep file): every point runs it, with
    the sweep's args, under the point's strategy; the runs are stored as train's are and the
    sweep file written back names the script."""
    scripts = Path(__file__).parent / "scripts"
    sweep_file = write_sweep(scripts.parent / f"sweep-{tmp_path.name}.toml", f"""
name = "script sweep"
script = "scripts/user_loop.py"
args = ["--epochs", "2", "--optimizer", "sgd"]
[base]
workers = 2
servers = 1
out = "{tmp_path}"
[grid]
strategy = ["allreduce", "bsp"]
""")
    try:
        sweep = load_sweep(sweep_file)
    finally:
        sweep_file.unlink()
    assert sweep.script == str(scripts / "user_loop.py")
    log = io.StringIO()
    outcome = run_sweep(sweep, stream=log)
    assert outcome.failures == [] and outcome.ran == 2, log.getvalue()
    summaries = [json.loads((tmp_path / run_id / "summary.json").read_text())
                 for run_id in outcome.run_ids]
    runs = {s["strategy"]: s for s in summaries}
    assert set(runs) == {"allreduce", "bsp"}
    for summary in runs.values():
        assert summary["script"] == str(scripts / "user_loop.py")
        assert summary["epochs"] == 2  # the script's --epochs, as the args say
    again = parse_sweep(__import__("tomllib").loads(sweep.to_toml()), out=str(tmp_path))
    assert (again.script, again.args) == (sweep.script, sweep.args)


@pytest.mark.parametrize(("data", "needle"), [
    ({"script": "", "grid": {"strategy": ["bsp"]}}, "script must be a path"),
    ({"script": "nowhere.py", "grid": {"strategy": ["bsp"]}}, "no script 'nowhere.py'"),
    ({"args": ["x"], "grid": {"strategy": ["bsp"]}}, "args is given without a script"),
    ({"script": __file__, "args": [3], "grid": {"strategy": ["bsp"]}},
     "args must be a list of strings"),
])
def test_a_bad_script_in_a_sweep_is_one_line(data, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_sweep(data)


def test_a_key_with_a_line_break_is_quoted_in_its_one_line_error(tmp_path):
    # Found by the fuzzer: a nested key's carriage return split the error in two lines.
    with pytest.raises(ConfigError) as info:
        parse_sweep({"base": {"alpha": [{"\r": 2**63}]}, "grid": {"workers": [1]}},
                    out=str(tmp_path))
    assert str(info.value) == "base.alpha.'\\r': an integer beyond 64 bits is no run setting"
