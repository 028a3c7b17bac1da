"""What a script's run stores is what it trained (tests/scripts/faithful.py: a tied language
model with BatchNorm, SGD with Nesterov momentum under OneCycleLR, or AdamW over two groups
under a plateau scheduler): `model.pt` and every worker's model after job.finish() are the
run's final model, ties and BatchNorm's workers' mean kept, under every family of strategy;
the final figures are that model's; every scheduled setting reaches the servers; global
clipping is DDP's; workers that must agree are checked to; a forgotten call is handled."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from polyrhythm import api
from polyrhythm.errors import ConfigError, RunFailed
from polyrhythm.launch.rank.script_rank import job_config
from polyrhythm.metrics.records import RunRecord
from polyrhythm.runtime.worker.script import Job
from polyrhythm.runtime.worker.script_data import ShardSampler

SCRIPT = Path(__file__).parent / "scripts" / "faithful.py"
USER_LOOP = Path(__file__).parent / "scripts" / "user_loop.py"
_spec = importlib.util.spec_from_file_location("faithful", SCRIPT)
faithful = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faithful)
EPOCHS, WORKERS = 3, 2
STEPS = faithful.EXAMPLES // WORKERS // faithful.BATCH  # each worker's, an epoch
# One of each family: all-reduce, synchronous PS, a quorum's PS, Downpour's local steps,
# elastic averaging, gossip's consensus, Strategy-Switch (all-reduce, then asp).
FAMILIES = {"allreduce": {}, "bsp": {}, "kasp": {}, "downpour": {"fetch_every": 2},
            "easgd": {}, "gossip": {}, "switch": {"at": 0.5}}


class Ran:
    """A finished run of the script: its summary, its folder and what its workers wrote."""

    def __init__(self, summary: dict, folder: Path) -> None:
        self.summary, self.folder = summary, folder
        self.stored = torch.load(RunRecord(folder / "runs", summary["run_id"]).model_path)

    def worker(self, kind: str, w: int) -> dict[str, torch.Tensor]:
        return torch.load(self.folder / f"{kind}-{w}.pt")


_RUNS: dict[tuple, Ran] = {}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The script run under a strategy with these arguments, once for the module."""
    def run(strategy: str, *args: str, **config) -> Ran:
        key = (strategy, args, tuple(sorted(config.items())))
        if key not in _RUNS:
            folder = tmp_path_factory.mktemp(strategy)
            summary = api.run_script(
                SCRIPT, ["--epochs", str(EPOCHS), "--save", str(folder / "saved.pt"),
                         "--dump", str(folder), *args],
                {"out": str(folder / "runs"), "seed": 0, "workers": WORKERS,
                 "strategy": strategy, **FAMILIES.get(strategy, {}), **config})
            _RUNS[key] = Ran(summary, folder)
        return _RUNS[key]
    return run


def evaluated(state: dict[str, torch.Tensor]) -> dict[str, float]:
    model = faithful.TiedLM()
    model.load_state_dict(state)
    return faithful.evaluate(model)


def farthest(a: dict, b: dict, keys=None) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys or a)


PARAMETERS = [n for n, _ in faithful.TiedLM().named_parameters(remove_duplicate=False)]


@pytest.mark.parametrize("strategy", list(FAMILIES))
def test_the_stored_model_is_the_runs_final_model(ran, strategy: str) -> None:
    run = ran(strategy)
    stored = run.stored
    # The tie held, bit for bit: one tensor under two names.
    assert torch.equal(stored["embed.weight"], stored["head.weight"])
    # Every worker holds the run's final model after job.finish(); job.save wrote it once.
    for model in (run.worker("final", 0), run.worker("final", 1),
                  torch.load(run.folder / "saved.pt")):
        assert model.keys() == stored.keys()
        assert all(torch.equal(model[k], stored[k]) for k in stored)
    # BatchNorm's statistics: the workers' mean (equal batch shares) of what each held.
    own = [run.worker("own", w) for w in range(WORKERS)]
    for name in ("norm.running_mean", "norm.running_var"):
        mean = (own[0][name].double() + own[1][name].double()) / 2
        assert float((stored[name].double() - mean).abs().max()) <= 1e-6
        assert not torch.equal(own[0][name], own[1][name])  # a mean of two differing things
    assert int(stored["norm.num_batches_tracked"]) == EPOCHS * STEPS
    # The final figures are the script's evaluation of model.pt.
    figures = evaluated(stored)
    summary = run.summary
    assert summary["final_evaluated"]
    assert summary["final_val_loss"] == pytest.approx(figures["val_loss"], rel=1e-6)
    assert summary["final_val_accuracy"] == figures["val_accuracy"]


def test_servers_follow_a_cycled_momentum_as_allreduce_does(ran) -> None:
    """OneCycleLR cycles SGD's momentum (0.95 to 0.85 and back) with its rate: every push
    carries both, so bsp's servers step what every all-reduce worker steps."""
    bsp, allreduce = ran("bsp").stored, ran("allreduce").stored
    assert farthest(bsp, allreduce) <= 1e-5


def test_servers_follow_every_group_of_adamw_under_a_shared_plateau(ran) -> None:
    """AdamW over two param groups (decay on the weights only), its rate halved by a
    plateau scheduler stepped on the workers' mean figure: bsp's servers follow each
    group's settings as the workers' optimizers hold them, as all-reduce does."""
    args = ("--optimizer", "adamw", "--plateau", "mean", "--epochs", "4")  # halved at 3
    bsp, allreduce = ran("bsp", *args), ran("allreduce", *args)
    for run in (bsp, allreduce):  # halved after epochs 3 and 4: both groups, every worker
        assert [run.worker("lr", w) for w in range(WORKERS)] == [[0.0125, 0.0125]] * WORKERS
    assert farthest(bsp.stored, allreduce.stored) <= 1e-5


def reference(clip: float) -> tuple[dict[str, torch.Tensor], int]:
    """DDP's training of the script, in one process: each worker's batch through the model
    in turn (BatchNorm's statistics per worker's batch, as DDP without SyncBatchNorm), the
    mean of their losses, the averaged gradient clipped, one step. Its parameters, and how
    many steps the clip cut."""
    model, opt, sched = faithful.build("sgd", EPOCHS, STEPS)
    data = faithful.data()
    samplers = [ShardSampler(len(data), w, WORKERS, seed=0) for w in range(WORKERS)]
    cut = 0
    for _ in range(EPOCHS):
        orders = [list(s) for s in samplers]
        for step in range(STEPS):
            losses = [F.cross_entropy(model(x), y) for x, y in (
                data[order[step * faithful.BATCH:(step + 1) * faithful.BATCH]]
                for order in orders)]
            (sum(losses) / WORKERS).backward()
            cut += int(torch.nn.utils.clip_grad_norm_(model.parameters(), clip) > clip)
            opt.step()
            opt.zero_grad()
            sched.step()
    return {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}, cut


@pytest.mark.parametrize("strategy", ["allreduce", "bsp"])
def test_global_clipping_is_ddps(ran, strategy: str) -> None:
    """job.clip_grad_norm_ clips the workers' mean gradient, as DDP's clip after its
    backward does, where every update applies every worker's gradient."""
    expected, cut = reference(clip=0.5)
    assert cut >= STEPS  # the clip cut many steps: the test would see it missing
    assert farthest(ran(strategy, "--clip", "0.5").stored, expected, PARAMETERS) <= 1e-5
    unclipped, _ = reference(clip=1e9)
    assert farthest(ran(strategy).stored, unclipped, PARAMETERS) <= 1e-5
    assert farthest(expected, unclipped) > 1e-3


def test_workers_that_drift_apart_under_allreduce_are_one_line(tmp_path: Path) -> None:
    """Each worker steps its plateau scheduler on its own training loss: their rates part,
    and the epoch's agreement check names the setting and the remedy."""
    with pytest.raises(RunFailed) as failed:
        api.run_script(SCRIPT, ["--optimizer", "adamw", "--plateau", "own"],
                       {"out": str(tmp_path / "runs"), "seed": 0, "workers": WORKERS,
                        "strategy": "allreduce"})
    line = str(failed.value)
    assert "\n" not in line and "workers 0 and 1 hold different parameters after epoch" in line
    assert "lr differ" in line and "job.mean(value)" in line


def test_a_forgotten_finish_is_finished_at_exit(tmp_path: Path, capfd) -> None:
    summary = api.run_script(SCRIPT, ["--fault", "forget-finish"],
                             {"out": str(tmp_path / "runs"), "seed": 0, "workers": WORKERS,
                              "strategy": "bsp"})
    assert summary["status"] == "completed" and summary["epochs"] == EPOCHS
    assert "worker 0's script ended without job.finish(): finished it" in capfd.readouterr().out
    assert not summary["final_evaluated"]  # nobody evaluated it: unknown, not worker 0's log
    stored = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert torch.equal(stored["embed.weight"], stored["head.weight"])


def test_a_script_that_never_joins_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as failed:
        api.run_script(SCRIPT, ["--fault", "no-init"], {
            "out": str(tmp_path / "runs"), "seed": 0, "workers": WORKERS, "strategy": "bsp"})
    line = str(failed.value)
    assert "\n" not in line
    assert "ran the script without joining its job: it never called polyrhythm.init()" in line


# -- what a script's run records and refuses ----------------------------------------------

def test_the_record_describes_what_the_script_did(ran) -> None:
    """The script's 4 epochs of 12 examples a worker and its 408 parameters (the tied
    output layer counted once), its name; no data set, model, batch size or optimizer of
    polyrhythm train's that it never read."""
    run = ran("bsp", "--optimizer", "adamw", "--plateau", "mean", "--epochs", "4")
    summary = run.summary
    record = RunRecord(run.folder / "runs", summary["run_id"])
    assert (summary["epochs"], summary["worker_batch_size"], summary["batch_size"]) == (
        4, [12, 12], 24)
    assert summary["parameters"] == 408 and summary["script"] == str(SCRIPT)
    row = record.store.run(summary["run_id"])
    assert (row["epochs"], row["dataset"], row["model"]) == (4, "script", SCRIPT.name)
    config = tomllib.loads((record.dir / "config.toml").read_text())
    assert not {"data", "model", "optimizer", "batch_size", "epochs", "loss"} & set(config)
    assert row["config"] == (record.dir / "config.toml").read_text()


@pytest.mark.parametrize(("given", "says"), [
    ({"batch_size": 32}, "--batch-size set polyrhythm train's own job"),
    ({"dataset": "digits", "val_fraction": 0.2}, "--dataset and --val-fraction set"),
    ({"model": "mlp", "loss": "mse"}, "--loss and --model set"),
])
def test_train_settings_a_script_never_reads_are_one_line_before_any_record(
        tmp_path: Path, given: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        api.run_script(SCRIPT, [], {"out": str(tmp_path / "runs"), "workers": 2, **given})
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("given", "says"), [
    ({"lr": 5.0, "momentum": 0.5}, "--lr and --momentum set the run's own optimizer, but the "
                                   "script steps its own (SGD)"),
    ({"epochs": 5}, "--epochs 5 was given, but the script runs job.epochs(3)"),
])
def test_run_settings_the_scripts_own_replace_are_one_line(tmp_path: Path, given: dict,
                                                           says: str) -> None:
    with pytest.raises(RunFailed, match=re.escape(says)) as failed:
        api.run_script(SCRIPT, [], {"out": str(tmp_path / "runs"), "workers": 2,
                                    "strategy": "bsp", **given})
    assert "\n" not in str(failed.value)


def test_a_switch_at_a_share_of_epochs_nobody_counted_is_one_line(tmp_path: Path) -> None:
    """A script looping on range(n), not job.epochs(n): rule at needs --epochs, which it
    then counts (4 epochs: all-reduce for 2)."""
    config = {"out": str(tmp_path / "runs"), "workers": 2, "seed": 0, "strategy": "switch",
              "at": 0.5, "servers": 1}
    with pytest.raises(RunFailed, match=r"switch's rule at switches after 0\.5 of the run's "
                                        r"epochs, but the script does not say how many"):
        api.run_script(USER_LOOP, ["--plain-epochs"], config)
    summary = api.run_script(USER_LOOP, ["--plain-epochs"], {**config, "epochs": 4})
    assert summary["switch_epoch"] == 2 and summary["epochs"] == 4


def test_torchrun_without_servers_gets_polyrhythm_runs_default(monkeypatch) -> None:
    monkeypatch.delenv("POLYRHYTHM_CONFIG", raising=False)
    monkeypatch.delenv("POLYRHYTHM_SERVERS", raising=False)
    monkeypatch.delenv("POLYRHYTHM_STRATEGY", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    config = job_config()  # polyrhythm run's default strategy, bsp, with its one server
    assert (config.strategy.name, config.servers, config.workers) == ("bsp", 1, 2)
    for strategy, servers in (("easgd", 1), ("allreduce", 0)):
        monkeypatch.setenv("POLYRHYTHM_STRATEGY", strategy)
        config = job_config()
        assert (config.servers, config.workers) == (servers, 3 - servers)
    monkeypatch.setenv("POLYRHYTHM_SERVERS", "two")
    with pytest.raises(ConfigError, match="POLYRHYTHM_SERVERS='two': give a number"):
        job_config()


def test_a_closure_optimizer_is_refused_by_name_at_wrap() -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="LBFGS steps with a closure"):
        Job(None).wrap(model, torch.optim.LBFGS(model.parameters()))
