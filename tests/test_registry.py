"""A new strategy or data set is its declaration and one registry line: flags, checks, errors
and listings follow from the declaration, with no other file edited. A new launcher is its
class and its line in LAUNCHERS, which launcher_of asks in order."""

from __future__ import annotations

import tomllib

import pytest

from polyrhythm.cli import build_parser, main
from polyrhythm.config import make_config
from polyrhythm.data import DATASETS, DatasetSpec
from polyrhythm.errors import ConfigError
from polyrhythm.launch.launchers import registry
from polyrhythm.settings import Param, Rule, within
from polyrhythm.strategies import STRATEGIES, StrategySpec
from polyrhythm.strategies.consistency import AsynchronousPolicy

TOY_STRATEGY = StrategySpec(
    "toy", "a toy asynchronous parameter server", source="this test",
    worker="polyrhythm.strategies.ps_worker:ParameterServerWorker",
    policy=lambda settings, workers: AsynchronousPolicy(workers),
    params=(Param("toy_damping", float, "how much the toy damps each push", 0.25,
                  rule=within(0, 1, high_open=True)),))

TOY_DATASET = DatasetSpec(
    "toyset", "a toy data set", loader="polyrhythm.data.datasets:load_digits",
    params=(Param("toy_noise", int, "noise level of the toy data", 3,
                  rule=Rule(lambda v, run: v % 2 == 1, lambda run: "be odd")),))


@pytest.fixture
def toys():
    STRATEGIES.register(TOY_STRATEGY)  # the one line a new strategy needs
    DATASETS.register(TOY_DATASET)  # and a new data set
    yield
    STRATEGIES.unregister("toy")
    DATASETS.unregister("toyset")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse: --help, usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *args: str) -> str:
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_registered_strategy_gets_a_flag_checks_errors_and_a_listing(toys, capsys):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0
    assert "--toy-damping X" in out and "toy: how much the toy damps each push" in out

    err = one_line_error(capsys, "train", "--strategy", "toy", "--toy-damping", "1.5")
    assert "toy_damping must be in [0, 1), got 1.5" in err
    err = one_line_error(capsys, "train", "--strategy", "toy", "--toy-damping", "lots")
    assert "--toy-damping: invalid float value: 'lots'" in err
    err = one_line_error(capsys, "train", "--strategy", "bsp", "--toy-damping", "0.5")
    assert "strategy 'bsp' takes no --toy-damping (its parameters: none; --toy-damping is " \
           "for toy)" in err

    code, out, _ = run_cli(capsys, "strategies")
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("toy ")))
    assert "a toy asynchronous parameter server [this test]" in lines[at]
    assert lines[at + 1].split()[:2] == ["--toy-damping", "X"]
    assert lines[at + 1].endswith("(default: 0.25)")

    config = make_config({"strategy": "toy", "toy_damping": 0.5, "workers": 2})
    assert config.strategy.toy_damping == 0.5 and config.servers == 1
    assert make_config({"strategy": "toy"}).strategy.toy_damping == 0.25


def test_a_registered_data_set_gets_a_flag_checks_errors_and_a_listing(toys, capsys):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert "--toy-noise N" in out and "toyset: noise level of the toy data" in out

    err = one_line_error(capsys, "train", "--dataset", "toyset", "--toy-noise", "4")
    assert "toy_noise must be odd, got 4" in err
    err = one_line_error(capsys, "train", "--dataset", "mnist5k", "--toy-noise", "5")
    assert "dataset 'mnist5k' takes no --toy-noise" in err

    code, out, _ = run_cli(capsys, "datasets")
    assert any(line.startswith("toyset ") for line in out.splitlines())
    assert "    --toy-noise N" in out and "(default: 3)" in out
    assert make_config({"dataset": "toyset", "toy_noise": 5}).data.toy_noise == 5


def test_names_are_unique_within_a_kind_and_a_parameter_has_one_type(toys):
    with pytest.raises(ValueError, match="already registered"):
        STRATEGIES.register(TOY_STRATEGY)
    clash = StrategySpec("toy2", "declares tau as a float", worker="x:y",
                         params=(Param("tau", float, "not the tau of localsgd"),))
    with pytest.raises(ValueError, match="declares tau as float, 'easgd' as int"):
        STRATEGIES.register(clash)


def test_a_parameter_named_as_a_setting_of_another_section_is_an_error(capsys):
    lr = StrategySpec("lr-toy", "declares lr", worker="x:y", params=(
        Param("lr", float, "a second learning rate"),))
    STRATEGIES.register(lr)
    try:
        with pytest.raises(ValueError, match="'lr' is declared in two sections"):
            make_config({})
    finally:
        STRATEGIES.unregister("lr-toy")


TOY_SWITCH = StrategySpec(
    "toy-switch", "one strategy, then another", worker="x:y",
    policy=lambda settings, workers: AsynchronousPolicy(workers),
    params=(Param("toy_first", str, "the first phase's strategy", "allreduce",
                  section="strategy"),
            Param("toy_then", str, "the second phase's strategy", "asp", section="strategy")))


def test_a_strategys_settings_may_hold_other_strategies_settings(tmp_path):
    STRATEGIES.register(TOY_SWITCH)
    try:
        config = make_config({"strategy": {"name": "toy-switch",
                                           "toy_then": {"name": "ssp", "staleness": 2}},
                              "workers": 4})
        first, then = config.strategy.toy_first, config.strategy.toy_then
        assert (first.name, then.name, then.staleness) == ("allreduce", "ssp", 2)
        assert then.value_bound is None
        # Saved as nested tables, loaded back to the same run; a flat key names a half.
        assert "[strategy.toy_then]" in config.to_toml()
        assert make_config(tomllib.loads(config.to_toml())) == config
        flat = make_config({"strategy": "toy-switch", "toy_first": "ring", "workers": 4})
        assert flat.strategy.toy_first.name == "ring"
        # A half's settings are checked as its own strategy's.
        with pytest.raises(ConfigError, match="strategy 'ssp' takes no --tau"):
            make_config({"strategy": {"name": "toy-switch",
                                      "toy_then": {"name": "ssp", "tau": 2}}})
        with pytest.raises(ConfigError, match="staleness must be at least 0, got -1"):
            make_config({"strategy": {"name": "toy-switch",
                                      "toy_then": {"name": "ssp", "staleness": -1}}})
        with pytest.raises(ConfigError, match="unknown strategy 'nope'"):
            make_config({"strategy": "toy-switch", "toy_then": "nope"})
        with pytest.raises(ConfigError, match="toy_then needs the name of a strategy"):
            make_config({"strategy": {"name": "toy-switch", "toy_then": {"staleness": 2}}})
        with pytest.raises(ConfigError, match="inside another strategy, cannot hold toy_first"):
            make_config({"strategy": "toy-switch", "toy_then": "toy-switch"})
    finally:
        STRATEGIES.unregister("toy-switch")


def test_a_switch_is_listed_bare_as_the_parser_takes_it(capsys):
    code, out, _ = run_cli(capsys, "datasets")
    augment = [line.split()[:2] for line in out.splitlines() if "--augment" in line]
    assert code == 0 and augment == [["--augment", "random"]] * 2  # cifar10's and cifar100's
    assert "--augment VALUE" not in out
    parser = build_parser()
    assert parser.parse_args(["train", "--augment"]).augment is True
    assert parser.parse_args(["train", "--no-augment"]).augment is False


@pytest.mark.parametrize(("fields", "name"), [
    ({"strategy": "bsp", "workers": 2}, "local"),
    ({"strategy": "bsp", "workers": 2, "hosts": 2}, "emulated"),
    ({"strategy": "bsp", "workers": 2, "launcher": "spark"}, "spark"),
    ({"strategy": "mapreduce", "workers": 2}, "spark"),
])
def test_a_config_runs_on_the_first_launcher_that_claims_it(fields, name):
    assert registry.launcher_of(make_config(fields)).name == name


def test_a_launcher_is_taken_by_its_registry_line_alone(monkeypatch):
    class Elsewhere(registry.Launcher):
        name, title = "elsewhere", "elsewhere"

        def claims(self, config) -> bool:
            return config.workers == 3

    monkeypatch.setattr(registry, "LAUNCHERS",
                        {"elsewhere": Elsewhere(), **registry.LAUNCHERS})
    assert registry.launcher_of(make_config({"strategy": "bsp", "workers": 3})).name == "elsewhere"
    assert registry.launcher_of(make_config({"strategy": "bsp", "workers": 2})).name == "local"
