"""The examples (examples/*.py) run as a user runs them: through `polyrhythm run` with 2
workers (api.run_script, or the command line), or alone with plain python. Each learns (its
loss falls), its run is recorded, and worker 0 saves the model it trained. Then the survey:
every strategy trains the language-model example and its loss falls."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from helpers import HANG_GUARD_S
from polyrhythm import api
from polyrhythm.cli import main
from polyrhythm.errors import ConfigError, DataError
from polyrhythm.metrics.records import STORE_NAME, RunRecord
from polyrhythm.metrics.store import RunStore
from polyrhythm.strategies import STRATEGIES

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE = Path(__file__).resolve().parents[1] / "src"

# The language model at its smallest: 1,800 training characters in windows of 16 make 7
# steps of 8 windows an epoch for each of 2 workers, so 21 steps are 3 epochs; the training
# itself takes a fraction of a second, the rest of a run is starting its processes.
TINY_LM = ["--chars", "2000", "--context", "16", "--batch", "8", "--width", "16",
           "--layers", "1", "--heads", "2", "--lr", "2e-2", "--steps", "21", "--log-every", "0"]
LM_BLOCK_KEYS = {f"blocks.0.{name}" for name in (
    "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
    "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
    "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")}
LM_KEYS = {"token.weight", "position.weight", "norm.weight", "norm.bias", "head.weight",
           "head.bias"} | LM_BLOCK_KEYS


def example(name: str) -> ModuleType:
    """An example script as a module (its __main__ block not run)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path: Path, name: str, args: list[str], **config) -> dict:
    return api.run_script(EXAMPLES / f"{name}.py", args,
                          {"out": str(tmp_path / "runs"), "seed": 0, "workers": 2, **config})


def recorded(summary: dict, figure: str) -> list[float]:
    return [epoch[figure] for epoch in summary["epoch_metrics"]]


def assert_learned(summary: dict) -> None:
    """Completed and stored, and the mean training loss of the last epoch well under the
    first's (the validation figures each test checks as fits its model: a first epoch can
    reach nearly the final validation loss)."""
    assert summary["status"] == "completed"
    row = RunStore(Path(summary["run_dir"]).parent / STORE_NAME).run(summary["run_id"])
    assert row["status"] == "completed"
    train = recorded(summary, "train_loss")
    assert train[-1] < 0.9 * train[0], train
    # The final figures are the script's evaluation of the stored model (job.finish's).
    assert summary["final_evaluated"] and math.isfinite(summary["final_val_loss"])


@functools.cache
def untrained_lm_loss() -> float:
    return lm_validation_loss(None)


@functools.cache
def tiny_lm_validation() -> tuple[ModuleType, object, object, int]:
    """The example, its arguments, its validation text and vocabulary size, for TINY_LM."""
    char_lm = example("char_lm")
    args = char_lm.arguments(TINY_LM)
    _, validation, vocabulary = char_lm.datasets(char_lm.corpus(args.chars), args.context)
    return char_lm, args, validation, vocabulary


def lm_validation_loss(state: dict[str, torch.Tensor] | None) -> float:
    """The tiny language model's validation loss with these parameters (None: untrained),
    from the example's own data, model and measure."""
    char_lm, args, validation, vocabulary = tiny_lm_validation()
    model, _, _ = char_lm.build(args, vocabulary)
    if state is not None:
        model.load_state_dict(state)
    return char_lm.validation_loss(model, validation)


def assert_lm_trained(summary: dict) -> None:
    """The run's stored model (the servers' or the workers', whatever the strategy) is well
    better than the untrained one on the validation text. Not worker 0's logged figures: in
    a quorum strategy the fastest worker may close every round, and worker 0's model then
    stays as it last pulled it."""
    stored = torch.load(RunRecord(Path(summary["run_dir"]).parent, summary["run_id"]).model_path)
    assert lm_validation_loss(stored) < 0.85 * untrained_lm_loss()


def plain_python(tmp_path: Path, *command: str) -> subprocess.CompletedProcess:
    """An example run alone, as `python examples/x.py` (no launcher: no RANK)."""
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    # One thread: the machine's cores are shared, and oversubscribed threads crawl.
    env |= {"PYTHONPATH": str(SOURCE), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def lm_under(tmp_path_factory):
    """`lm_under(strategy)`: (summary, saved model's path) of the tiny language model run
    under the strategy with its defaults and --save, made once for the module: the ssp run
    is both the saving example's and the survey's."""
    made: dict[str, tuple[dict, Path]] = {}

    def get(strategy: str) -> tuple[dict, Path]:
        if strategy not in made:
            folder = tmp_path_factory.mktemp(strategy)
            saved = folder / "lm.pt"
            made[strategy] = run(folder, "char_lm", [*TINY_LM, "--save", str(saved)],
                                 strategy=strategy), saved
        return made[strategy]
    return get


# -- the language model ------------------------------------------------------------------

def test_char_lm_under_ssp_with_a_server_learns_and_saves_its_model(lm_under) -> None:
    summary, saved = lm_under("ssp")  # a parameter-server strategy: one server by default
    assert_learned(summary)
    assert_lm_trained(summary)
    # The final figures are the example's own evaluation of the stored model.
    stored_state = torch.load(RunRecord(Path(summary["run_dir"]).parent,
                                        summary["run_id"]).model_path)
    assert summary["final_val_loss"] == pytest.approx(lm_validation_loss(stored_state), rel=1e-6)
    assert 0 < summary["final_val_accuracy"] < 1
    assert summary["epochs"] == 3 and summary["servers"] == 1
    assert summary["weight_updates"] == 2 * 21  # every push its own update
    model = torch.load(saved)
    assert set(model) == set(stored_state) == LM_KEYS
    vocabulary = model["token.weight"].shape[0]
    assert model["token.weight"].shape == (vocabulary, 16)
    assert model["position.weight"].shape == (16, 16)
    assert model["head.weight"].shape == (vocabulary, 16)


def test_char_lm_runs_alone_with_plain_python(tmp_path: Path) -> None:
    saved = tmp_path / "alone.pt"
    done = plain_python(tmp_path, str(EXAMPLES / "char_lm.py"), *TINY_LM, "--log-every", "3",
                        "--save", str(saved))
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([\d.]+)$", done.stdout, re.M)]
    assert len(losses) == 7 and losses[-1] < 0.9 * losses[0], done.stdout
    # After each epoch (alone, one worker takes 14 steps an epoch: 2 epochs), the validation
    # loss and next-character accuracy.
    validated = re.findall(r"^val_loss (\d\.\d{4}) val_accuracy (\d\.\d{4})$", done.stdout,
                           re.M)
    assert len(validated) == 2 and all(0 < float(a) < 1 for _, a in validated), done.stdout
    assert set(torch.load(saved)) == LM_KEYS
    assert not (tmp_path / "runs").exists()  # alone, nothing is recorded


def test_char_lm_ddp_trains_with_the_powersgd_hook(tmp_path: Path) -> None:
    """--ddp --powersgd: DDP with torch's PowerSGD hook, under torchrun. Width 128 makes
    1.7 MB of gradients, which DDP's default buckets would split in two after the first step;
    the hook then failed under Gloo within a few steps (a collective mismatch), so the
    script keeps one bucket."""
    env = {**os.environ, "PYTHONPATH": str(SOURCE), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(EXAMPLES / "char_lm.py"), "--ddp",
                           "--powersgd", "2", "--chars", "20000", "--context", "16",
                           "--batch", "4", "--width", "128", "--steps", "8", "--log-every",
                           "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([\d.]+)$", done.stdout, re.M)]
    assert len(losses) == 8 and losses[-1] < losses[0], done.stdout
    assert re.search(r"^val_loss \d\.\d{4} val_accuracy \d\.\d{4}$", done.stdout, re.M)


def test_char_lm_powersgd_without_ddp_is_one_line(monkeypatch, capfd) -> None:
    """Under polyrhythm (or alone) the compression is polyrhythm run's, not the script's.
    The script as `python examples/char_lm.py --powersgd 4` runs it (as __main__, with that
    argv and no RANK), in this process: it stops at its arguments."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / "char_lm.py"), "--powersgd", "4"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(EXAMPLES / "char_lm.py"), run_name="__main__")
    out, err = capfd.readouterr()
    assert done.value.code == 2 and out == ""
    assert err == ("char_lm.py: error: --powersgd R is DDP's PowerSGD hook, for --ddp; "
                   "under polyrhythm give polyrhythm run --compress powersgd --rank R\n")


def test_char_lm_puts_decay_on_weight_matrices_only() -> None:
    char_lm = example("char_lm")
    args = char_lm.arguments(["--layers", "1"])
    model, opt, _ = char_lm.build(args, vocabulary=50)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed, kept = ({names[id(p)] for p in group["params"]} for group in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert decayed == {"blocks.0.self_attn.in_proj_weight", "blocks.0.self_attn.out_proj.weight",
                       "blocks.0.linear1.weight", "blocks.0.linear2.weight", "head.weight"}
    assert kept == set(names.values()) - decayed


# -- the tabular models ------------------------------------------------------------------

@pytest.mark.parametrize(("model", "layout", "extra", "config"), [
    ("linear", "msd", [], {"strategy": "allreduce"}),
    ("logistic", "higgs", [], {"strategy": "asp", "servers": 1}),
    ("mlp", "higgs", ["--optimizer", "adam"], {"strategy": "bsp", "servers": 1}),
])
def test_tabular_model_learns_its_data_set(tmp_path: Path, model: str, layout: str,
                                           extra: list[str], config: dict) -> None:
    data = tmp_path / f"{layout}.csv.gz"
    example("tabular").make_shaped(str(data), rows=1500, layout=layout, seed=0)
    saved = tmp_path / "model.pt"
    summary = run(tmp_path, "tabular", ["--model", model, "--data", str(data), "--epochs", "3",
                                        *extra, "--save", str(saved)], **config)
    assert_learned(summary)
    features = 90 if layout == "msd" else 28
    shapes = {k: tuple(v.shape) for k, v in torch.load(saved).items()}
    if model == "mlp":  # the study's 28-15-15-2 perceptron
        assert shapes == {"0.weight": (15, 28), "0.bias": (15,), "2.weight": (15, 15),
                          "2.bias": (15,), "4.weight": (2, 15), "4.bias": (2,)}
    else:
        assert shapes == {"weight": (1, features), "bias": (1,)}
    if model == "linear":  # the mean squared error of the standardised year: R^2 > 0.7
        assert recorded(summary, "val_loss")[-1] < 0.3
    else:
        assert recorded(summary, "val_accuracy")[-1] >= 0.8


def test_tabular_files_have_the_uci_shapes(tmp_path: Path) -> None:
    tabular = example("tabular")
    for layout, width in (("higgs", 29), ("msd", 91)):
        path = tmp_path / f"{layout}.csv"
        tabular.make_shaped(str(path), rows=50, layout=layout, seed=0)
        table = np.loadtxt(path, delimiter=",")
        assert table.shape == (50, width)
        target = table[:, 0]
        if layout == "higgs":
            assert set(target) == {0.0, 1.0}
        else:
            assert (target == target.round()).all() and 1922 <= target.min() <= target.max() <= 2011


@pytest.mark.parametrize(("content", "model", "says"), [
    (None, "logistic", "no data file"),
    ("1,2,x\n" * 20, "logistic", "not a comma-separated table of numbers"),
    ("1\n" * 20, "linear", "1 columns; a target column and feature columns"),
    ("1997,0.5,0.1\n" * 20, "logistic", "the logistic model needs classes 0 and 1"),
])
def test_tabular_bad_data_is_one_line(tmp_path: Path, content: str | None, model: str,
                                      says: str) -> None:
    path = tmp_path / "data.csv"
    if content is not None:
        path.write_text(content)
    tabular = example("tabular")
    with pytest.raises(DataError, match=says):
        tabular.datasets(tabular.arguments(["--model", model, "--data", str(path)]))


def test_tabular_bad_data_through_polyrhythm_run_is_one_line_and_fails(tmp_path: Path,
                                                                       monkeypatch,
                                                                       capfd) -> None:
    """`polyrhythm run ... tabular.py -- --data missing.csv` (the command's main, in this
    process, run in tmp_path)."""
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--strategy", "allreduce", "--workers", "2", "--out",
                 str(tmp_path / "runs"), str(EXAMPLES / "tabular.py"), "--", "--data",
                 str(tmp_path / "missing.csv")])
    stdout, stderr = capfd.readouterr()
    assert code != 0 and "Traceback" not in stdout + stderr
    # Both workers fail alike; the launcher names the first to end, whose log has its line.
    failed = re.fullmatch(r"polyrhythm: error: run (\S+) failed: rank (\d) \(worker \d\) "
                          r"failed: exit code 1\n", stderr)
    assert failed, stderr
    log = RunRecord(tmp_path / "runs", failed[1]).log_path(int(failed[2])).read_text()
    assert log == f"tabular: error: no data file '{tmp_path / 'missing.csv'}'\n"


# -- the CNN -----------------------------------------------------------------------------

def test_mnist_cnn_learns_and_its_saved_model_is_the_runs(tmp_path: Path) -> None:
    saved = tmp_path / "cnn.pt"
    summary = run(tmp_path, "mnist_cnn", ["--epochs", "2", "--save", str(saved)],
                  strategy="allreduce")
    assert_learned(summary)
    assert recorded(summary, "val_accuracy")[-1] >= 0.9
    assert summary["final_val_accuracy"] >= 0.9
    # job.save writes the run's final model: the one recorded is the one saved.
    model = torch.load(saved)
    stored = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert model.keys() == stored.keys() and all(torch.equal(model[k], stored[k])
                                                 for k in model)


# -- the strategy survey -----------------------------------------------------------------

@pytest.mark.parametrize(("strategy", "compression"), [
    ("bsp", {"compress": "topk", "ratio": 0.05, "compress_replies": True}),
    ("allreduce", {"compress": "powersgd", "rank": 2}),
    ("gossip", {"compress": "qsgd"}),
])
def test_a_script_trains_the_lm_with_its_messages_compressed(tmp_path: Path, strategy: str,
                                                            compression: dict) -> None:
    """The user's own model and optimizer, its pushes and replies, all-reduces or model
    exchanges compressed: the loss falls, and the run records the compression."""
    summary = run(tmp_path, "char_lm", TINY_LM, strategy=strategy, **compression)
    assert summary["status"] == "completed"
    assert summary["compression"]["compressor"] == compression["compress"]
    assert summary["compression"]["dense_share"] < 0.5
    assert_lm_trained(summary)


@pytest.mark.parametrize("settings", [{"strategy": "mapreduce"}, {"launcher": "spark"}])
def test_a_script_on_spark_is_one_line_before_any_record(tmp_path: Path,
                                                         settings: dict) -> None:
    with pytest.raises(ConfigError, match="a script runs on this machine, an emulated "
                                          "cluster or torchrun, not on Spark"):
        run(tmp_path, "char_lm", TINY_LM, **settings)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "mapreduce"])
def test_every_strategy_trains_the_lm(lm_under, strategy: str) -> None:
    """Each strategy with its defaults (a parameter-server strategy gets its one server):
    2 workers, 21 steps of the tiny language model, and the loss falls: the stored model's
    on the validation text, and the training loss the workers recorded."""
    summary, _ = lm_under(strategy)
    assert summary["status"] == "completed" and summary["epochs"] == 3
    assert RunStore(Path(summary["run_dir"]).parent / STORE_NAME).run(
        summary["run_id"])["status"] == "completed"
    assert_lm_trained(summary)
    train = recorded(summary, "train_loss")  # the workers' mean: each computed on its model
    assert train[-1] < train[0], train
