"""Fuzzing the user's input: configs, flags, files and stores never end in a traceback.

Hypothesis generates TOML config files (the real flat keys and sections with values of every
TOML type, junk keys, and raw bytes that may be neither TOML nor UTF-8), the same configs as
`RunConfig(**values)` arguments, argument lists for `polyrhythm train`, `shard` and `compare`
made of the real flags with good and bad values, and sweep files for `polyrhythm sweep
--dry-run`. Half the configs are mostly valid, so that validation gets past the first key to
the rules across keys. Each input must be accepted, or rejected with one ConfigError line (the
CLI: one line on stderr and exit code 2); any other exception, or a message of more than one
line, is a bug. Nothing trains: the commands stop at a sentinel where they would start work.

An accepted config must also be one its consumers take (`honoured`): a timeout Gloo keeps,
waits a timed wait takes, step factors float32 weights take, QSGD codes within int32, CPU
shares the kernel's quota. Two of the tests set one numeric setting of a mostly valid config
to a value at an edge (0, -1, 2**40, 2**63 - 1, 1e10, 9e9, 1e308, inf, nan, a day and a
second, 1tbit, ...), through RunConfig and through `train`'s flags.

The files and stores the CLI reads are fuzzed too: run stores damaged column by column (any
value anywhere, a column left out, rows gone, the summary's JSON or the config's TOML
damaged) through `runs`, `runs --json`, `report`, `simulate --calibrate` and --compute-from;
and good files of each kind a reader takes (npz, CSV plain, gzip and zip, CIFAR's pickles in
a folder and a tar, script.json, a config), mutated byte-wise. Each is read, or one
PolyrhythmError line.

Budget (derandomized: CI runs the same examples every time; about 85 s on two cores):
    TOML files through load_config        1,200 examples
    raw text and bytes as config files      500
    RunConfig(**values)                   1,200
    `train` argument lists                1,200
    `shard` argument lists                  300
    `compare` argument lists                300
    sweep files                             300
    edge values, RunConfig and `train`  300 + 300
    damaged run stores                       25 (each through five commands, a report too)
    mutated files                           400
6,000 examples in all. POLYRHYTHM_FUZZ_SCALE=N runs N times as many, random ones, for a longer
hunt. Below the fuzz tests, one regular test per bug the fuzzing found.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gzip
import io
import json
import math
import os
import shutil
import tarfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tomli_w
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import hostile
import polyrhythm.api
import polyrhythm.cli.compare
import polyrhythm.cli.sweep
import polyrhythm.report.figures
import polyrhythm.runtime.job
import polyrhythm.sim.plot
from cifar_files import write_cifar
from polyrhythm.cli import main
from polyrhythm.comm.waiting import NEVER
from polyrhythm.compression.wire import qsgd_bits
from polyrhythm.config import COMPONENTS, RunConfig, flat_keys, load_config, owners
from polyrhythm.config.declared import default_workers
from polyrhythm.data.csvfile import read_table
from polyrhythm.data.datasets import NpzSource, load_cifar100
from polyrhythm.data.pickles import restricted_loads
from polyrhythm.errors import ConfigError, DataError, PolyrhythmError
from polyrhythm.launch.cluster.cgroups import PERIOD_US
from polyrhythm.launch.launchers.script_launcher import ScriptCall
from polyrhythm.metrics.records import flatten, measured_compute
from polyrhythm.settings import Param
from polyrhythm.sweep import parse_sweep
from polyrhythm.units import duration

KEYS = flat_keys()
SECTIONS = ("strategy", "data", "model", "optimizer", "cluster")
NAMES = sorted(name for kind in COMPONENTS.values() for name in kind.registry)
WORDS = [*NAMES, "real", "emulated", "dedicated", "collocated", "normal", "uniform",
         "exponential", "random", "mod", "stratified", "distribution-aware", "120ms", "0ms",
         "1.5s", "-3ms", "100mbit", "1gbit", "0mbit", "10mbps", "runs", "", " ", "nan",
         "pkg.mod:fn", "bsp\nasp", "'\"", "\x00", "é"]


SCALE = int(os.environ.get("POLYRHYTHM_FUZZ_SCALE", "1"))
STORE_EXAMPLES, FILE_EXAMPLES = 25, 400


def budget(examples: int):
    """Hypothesis settings of one fuzz test: `examples` of them, the same ones every run, no
    deadline (the first example imports a lot). POLYRHYTHM_FUZZ_SCALE=20 runs twenty times as
    many, different ones each time: a longer hunt than CI's."""
    return settings(max_examples=examples * SCALE, derandomize=SCALE == 1, deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --- values ------------------------------------------------------------------------------------

huge_ints = st.sampled_from([2**31, 2**40, 2**63 - 1, -(2**63), 2**63, 2**64, -(10**30),
                             10**400])
ints = st.integers(-3, 12) | st.integers() | huge_ints
EDGE_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, -1.0, 1e308, 5e-324, 1e-300, 9e9, 1e10,
               2.0**40]
floats = st.floats(-2, 3) | st.floats() | st.sampled_from(EDGE_FLOATS)
strings = st.sampled_from(WORDS) | st.text(max_size=12)
scalars = (ints | floats | strings | st.booleans() | st.datetimes() | st.dates() | st.times())
junk_keys = st.text(max_size=8) | st.sampled_from(["name", *SECTIONS])


def arrays_and_tables(inner: st.SearchStrategy, keys: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3)


any_value = st.recursive(
    scalars, lambda inner: arrays_and_tables(inner, st.sampled_from(sorted(KEYS)) | junk_keys),
    max_leaves=6)
STRATEGY_NAMES = sorted(COMPONENTS["strategy"].registry)


def plausible(p: Param | None) -> st.SearchStrategy:
    """Values of a key's own type, mostly near its range, so validation goes deep."""
    if p is None:  # strategy, dataset, model
        return st.sampled_from(NAMES)
    if p.section is not None:  # a composed strategy's half: a name or a table
        own = sorted(k for k, q in KEYS.items() if q is not None and q.section is None)
        table = st.tuples(st.sampled_from(STRATEGY_NAMES) | scalars | any_value,
                          st.lists(st.sampled_from(own).flatmap(
                              lambda k: st.tuples(st.just(k), plausible(KEYS[k]))), max_size=3))
        return st.sampled_from(STRATEGY_NAMES) | table.map(lambda t: {"name": t[0], **dict(t[1])})
    by_kind = {int: ints, float: floats, str: strings, bool: st.booleans()}
    if p.kind is list:
        one = by_kind[p.item]
        return st.lists(one, max_size=5) | (one if p.single else st.nothing())
    return by_kind[p.kind]


PLAUSIBLE = {key: plausible(p) for key, p in KEYS.items()}
# One key and its value: a real key with a value of its type or any value, or a junk key.
entries = (st.sampled_from(sorted(KEYS)).flatmap(
    lambda k: st.tuples(st.just(k), PLAUSIBLE[k] | any_value))
    | st.tuples(junk_keys, any_value))
sections = st.tuples(st.sampled_from(SECTIONS),
                     st.lists(entries, max_size=4).map(dict) | any_value)
chaotic = st.lists(entries | sections, max_size=8).map(dict)

# Configs that are mostly valid, so validation goes past the first key to the rules across
# keys (servers, clusters, emulated compute, composed strategies): a strategy, data set and
# model, a few keys they read with values of the right kind and usual range, now and then one
# of any kind, flat or in sections.
OWNERS = owners()
CHOICES = {"compute": ["real", "emulated"], "compute_distribution": ["normal", "exponential"],
           "placement": ["dedicated", "collocated"], "rule": ["at", "empirical", "straggler"],
           "labels": ["fine", "coarse"], "bandwidth": ["100mbit", "1gbit"],
           "sharding": ["random", "mod", "stratified", "distribution-aware"],
           "launcher": ["local", "spark"], "table_like": ["higgs", "msd"],
           "master": ["local-cluster[2,1,1024]", "spark://127.0.0.1:9", "local[2]"],
           "spark_conf": ["spark.ui.enabled=false", "x", "=y"],
           **dict.fromkeys(["compute_time", "compute_jitter", "latency", "latency_jitter"],
                           ["0ms", "120ms", "1.5s"])}


def usual(key: str, p: Param) -> st.SearchStrategy:
    """Values of a key's own type in its usual range (valid more often than not)."""
    if p.section is not None:
        return st.sampled_from(STRATEGY_NAMES)
    if p.kind is list:
        one = st.sampled_from(CHOICES.get(key, [])) if p.item is str else usual(key, Param(
            key, p.item, ""))
        return st.lists(one, max_size=4) | (one if p.single else st.nothing())
    by_kind = {int: st.integers(0, 8), bool: st.booleans(),
               float: st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, 1.5, 3.0]),
               str: st.sampled_from(CHOICES.get(key, ["runs"]))}
    return by_kind[p.kind]


@st.composite
def coherent(draw) -> dict[str, Any]:
    """A mostly valid config (see above)."""
    names = {section: draw(st.sampled_from(sorted(kind.registry)))
             for section, kind in COMPONENTS.items()}
    read = [k for k, section in OWNERS.items() if section not in COMPONENTS]
    read += [p.name for section, kind in COMPONENTS.items() for p in kind.params(names[section])]
    keys = draw(st.lists(st.sampled_from(read), max_size=5, unique=True))
    values = {key: draw(usual(key, KEYS[key]) if draw(st.integers(0, 9)) else PLAUSIBLE[key])
              for key in keys}
    if "data_path" in read and "data_path" not in values:  # cifar10, npz: read at training
        values["data_path"] = "data"
    if draw(st.booleans()):  # flat keys
        return {kind.name_key: names[s] for s, kind in COMPONENTS.items()} | values
    out: dict[str, Any] = {s: {"name": names[s]} for s in COMPONENTS}
    for key, value in values.items():
        section = OWNERS[key]
        (out.setdefault(section, {}) if section else out)[key] = value
    return out


configs = coherent() | chaotic


def check_rejection(exc: PolyrhythmError) -> None:
    event("rejected")
    message = str(exc)
    assert len(message.splitlines()) == 1, repr(message)


def honoured(config: RunConfig) -> None:
    """An accepted config is one its consumers take: a Gloo timeout of a millisecond or more
    under the 365 days of the waits that keep their own time; every emulated wait (a step
    slowed for up to the timeout too) one a timed wait takes (time.sleep and the others
    overflow past threading.TIMEOUT_MAX); step factors torch applies to float32 weights
    (Adam's first step divides lr by 1 - beta1); QSGD codes, sign and level, in an int32;
    each host's CPU share a cgroup quota of at least the kernel's 1 ms a period."""
    assert datetime.timedelta(milliseconds=1) <= datetime.timedelta(seconds=config.timeout)
    assert datetime.timedelta(seconds=config.timeout) < NEVER
    durations = [duration(t) for t in (config.compute_time, config.compute_jitter,
                                       config.cluster.latency, config.cluster.latency_jitter)
                 if t is not None]
    waits = [config.timeout, *durations, *config.worker_delay_s,
             *(factor * config.timeout for factor in config.slowdown)]
    for wait in waits:
        assert threading.Lock().acquire(timeout=wait)  # a free lock: at once, or overflow
    optimizer = config.optimizer
    beta1 = optimizer.betas[0] if optimizer.betas else 0.9
    for factor in (optimizer.lr / (1 - beta1), optimizer.weight_decay, optimizer.eps or 0.0):
        torch.zeros(1).add_(torch.ones(1), alpha=factor)  # RuntimeError past float32
    if config.compression.name == "qsgd":
        assert qsgd_bits(config.compression.levels) <= 31
    for cores in config.cluster.cpu:
        assert int(cores * PERIOD_US) >= 1000


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def load(path: Path) -> None:
    try:
        config = load_config(path)
    except PolyrhythmError as exc:
        check_rejection(exc)
    else:
        event("accepted")
        assert isinstance(config, RunConfig)


# --- TOML files and RunConfig ------------------------------------------------------------------

@budget(1200)
@given(values=configs)
def test_toml_configs_load_or_are_one_line_errors(scratch: Path, values: dict) -> None:
    path = scratch / "config.toml"
    try:
        path.write_text(tomli_w.dumps(values), encoding="utf-8")
    except (TypeError, ValueError):  # tomli_w cannot write it: no TOML file holds it
        return
    load(path)


@budget(500)
@given(data=st.binary(max_size=200)
       | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))
       | st.lists(st.sampled_from(["workers = ", "[strategy]\n", "name = ", '"ssp"', "\n",
                                   "= =", "tau = 2", "[[data]]", "lr = nan", "{", "}", "'",
                                   '"""', "\xff", "0x10", "1e999", "[cluster]\nhosts = "]),
                  max_size=12).map(lambda parts: "".join(parts).encode("utf-8")))
def test_raw_files_load_or_are_one_line_errors(scratch: Path, data: bytes) -> None:
    path = scratch / "raw.toml"
    path.write_bytes(data)
    load(path)


@budget(1200)
@given(values=configs)
@example(values={"self": []})  # found by this test: RunConfig's own parameter name
def test_run_configs_build_or_are_one_line_errors(values: dict) -> None:
    config = build(values)
    if config is not None:
        assert RunConfig(**config.to_dict()) == config


def build(values: dict) -> RunConfig | None:
    """RunConfig(**values), checked `honoured`; None where it is refused in one line."""
    try:
        config = RunConfig(**values)
    except PolyrhythmError as exc:
        check_rejection(exc)
        return None
    event("accepted")
    honoured(config)
    return config


# --- command-line flags ------------------------------------------------------------------------

JUNK_WORDS = st.sampled_from(["", "x", "1,2,x", ",", "-1", "1e3", "nan", "inf", "0x10", "1_000",
                              " 2", "2.5", "--", "-", "--workers", "true", "a b", "\n",
                              "9" * 5000])


def value_words(key: str) -> st.SearchStrategy[list[str]]:
    """The words after a flag: values of its type (as text) or junk."""
    p = KEYS[key]
    if p is not None and p.kind is list:
        item = plausible(Param(key, p.item, "")).map(str)
        return st.lists(item | JUNK_WORDS | st.lists(item, min_size=1, max_size=3).map(",".join),
                        max_size=4)
    if p is not None and p.section is not None:
        text = st.sampled_from(STRATEGY_NAMES)
    else:
        text = PLAUSIBLE[key].map(str)
    return st.lists(text | JUNK_WORDS | st.text(max_size=8), max_size=2)


def flag_words(key: str) -> st.SearchStrategy[list[str]]:
    """A flag and its words: `--flag a b`, `--flag=a b`, `--flag`, `--no-flag`."""
    p, flag = KEYS[key], "--" + key.replace("_", "-")
    if p is not None and p.kind is bool:
        return st.sampled_from([[flag], ["--no-" + flag[2:]], [f"{flag}=x"]])
    return value_words(key).flatmap(lambda w: st.sampled_from(
        [[flag, *w], [f"{flag}={w[0]}", *w[1:]] if w else [flag]]))


FLAG_WORDS = {key: flag_words(key) for key in KEYS}


def not_help(token: str) -> bool:
    """Not -h, --help or an abbreviation of it: help prints pages and exits with 0."""
    return not (token.startswith("-h") or token.startswith("--h")) or token.startswith("--ho")


def argv(keys: dict[str, Param | None], files: list[str],
         extra: tuple[st.SearchStrategy[list[str]], ...] = ()) -> st.SearchStrategy[list[str]]:
    """An argument list: real flags with values, sometimes --config, --json or junk words."""
    flags = st.sampled_from(sorted(keys)).flatmap(FLAG_WORDS.__getitem__)
    chunk = st.one_of(
        flags, flags, flags,
        st.sampled_from([*(["--config", f] for f in files), ["--config"], ["--json"],
                         ["--json", "yes"]]),
        st.lists(st.text(max_size=6).filter(not_help), min_size=1, max_size=2), *extra)
    return st.lists(chunk, max_size=6).map(lambda parts: [w for p in parts for w in p])


def as_flags(values: dict[str, Any], keys: dict[str, Param | None]) -> list[str]:
    """A config as the flags that set it (a composed strategy's tables left out)."""
    words: list[str] = []
    for key, value in flatten(values).items():
        flag = "--" + key.replace("_", "-")
        if key not in keys or isinstance(value, dict) or value == []:
            continue
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, *map(str, value if isinstance(value, list) else [value])]
    return words


def coherent_argv(keys: dict[str, Param | None], files: list[str],
                  extra: tuple[st.SearchStrategy[list[str]], ...] = ()):
    """The flags of a mostly valid config, now and then followed by more of any kind."""
    return st.tuples(coherent().map(lambda values: as_flags(values, keys)),
                     argv(keys, files, extra) | st.just([]) | st.just([])).map(
                         lambda t: t[0] + t[1])


class Accepted(Exception):
    """Raised where a command would start its work: its config was accepted."""


def _accept(*args: Any, **kwargs: Any) -> None:
    if args and isinstance(args[0], RunConfig):  # train's, plan_data's
        honoured(args[0])
    raise Accepted


def run_cli(args: list[str]) -> None:
    """`polyrhythm ARGS`: accepted (the sentinel), or one line on stderr and exit code 2."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except Accepted:
            event("accepted")
            return
        except SystemExit as exc:  # argparse
            code = exc.code
    event("rejected")
    stderr = err.getvalue()
    assert "Traceback" not in stderr + out.getvalue()
    assert code == 2, (code, args, stderr)
    assert out.getvalue() == "", (args, out.getvalue())
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("polyrhythm") and "error: " in lines[0], (
        args, stderr)


@pytest.fixture(scope="module")
def config_files(scratch: Path):
    """Commands stop at the sentinel where they would start working (train, resume, shard's
    data plan, compare's runs); the parser is built once (7 ms a time). Yields the paths a
    --config may take: a good file, a bad one, a directory and a missing file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(polyrhythm.api, "train", _accept)
        mp.setattr(polyrhythm.api, "resume", _accept, raising=False)  # train --resume
        mp.setattr(polyrhythm.runtime.job, "plan_data", _accept)
        mp.setattr(polyrhythm.cli.compare, "run_and_report", _accept)
        mp.setattr(polyrhythm.cli.sweep, "format_plan", _accept)  # sweep --dry-run
        mp.setattr(polyrhythm.cli.sweep, "run_and_report", _accept)
        mp.setattr(polyrhythm.cli, "build_parser", functools.cache(polyrhythm.cli.build_parser))
        good, bad = scratch / "good.toml", scratch / "bad.toml"
        good.write_text('workers = 2\n[strategy]\nname = "ssp"\n')
        bad.write_text("workers = [\n")
        yield [str(good), str(bad), str(scratch), str(scratch / "missing.toml"), "", "a\x00b"]


COMPARE_KEYS = {k: p for k, p in KEYS.items() if k != "strategy"}
PLOT = st.sampled_from([["--plot", "x.png"], ["--plot", "x.txt"], ["--plot"]])
COMPARE_OWN = st.one_of(
    st.lists(st.sampled_from([*STRATEGY_NAMES, "", "x", " bsp"]), max_size=4).map(
        lambda names: ["--strategies", ",".join(names)]),
    st.sampled_from([["--repeats", "0"], ["--repeats", "2"], ["--repeats", "x"],
                     ["--repeats", "-1"], ["--id", "my-id"], ["--id", "bad id/"], ["--id", ""],
                     ["--strategy", "bsp"]]))  # argparse reads it as --strategies


@budget(1200)
@given(data=st.data())
def test_train_flags_are_accepted_or_one_line_errors(config_files: list[str], data) -> None:
    run_cli(["train", *data.draw(argv(KEYS, config_files) | coherent_argv(KEYS, config_files))])


@budget(300)
@given(data=st.data())
def test_shard_flags_are_accepted_or_one_line_errors(config_files: list[str], data) -> None:
    args = argv(KEYS, config_files, (PLOT,)) | coherent_argv(KEYS, config_files, (PLOT,))
    run_cli(["shard", *data.draw(args)])


@budget(300)
@given(data=st.data())
def test_compare_flags_are_accepted_or_one_line_errors(config_files: list[str], data) -> None:
    args = (argv(COMPARE_KEYS, config_files, (COMPARE_OWN,))
            | coherent_argv(COMPARE_KEYS, config_files, (COMPARE_OWN,)))
    run_cli(["compare", *data.draw(args)])


# --- values at the edges of every numeric setting ---------------------------------------------

NUMERIC = sorted(k for k, p in KEYS.items() if p is not None and p.section is None
                 and (p.kind in (int, float) or p.item in (int, float)))
EDGE_INTS = [0, -1, 1, 2**31, 2**40, 2**63 - 1, -(2**63)]
EDGE_TEXT = {"duration": ["0ms", "86400s", "86401s", "10000000000s", "9" * 20 + "ms",
                          "0.0000001us"],
             "rate": ["1bit", "8kbit", "100gbit", "101gbit", "1tbit", "9" * 30 + "bit"]}
TEXTUAL = {"compute_time": "duration", "compute_jitter": "duration", "latency": "duration",
           "latency_jitter": "duration", "bandwidth": "rate"}
# What else a setting needs to be read at all: emulated compute, an emulated cluster.
NEEDS = {"compute_time": {"compute": "emulated"},
         "compute_jitter": {"compute": "emulated", "compute_time": "1ms"},
         "bandwidth": {"workers_per_host": 64}, "cpu": {"workers_per_host": 64},
         **dict.fromkeys(["components", "clusters", "max_iter"],
                         {"sharding": "distribution-aware"})}


@st.composite
def at_an_edge(draw) -> dict[str, Any]:
    """A valid config of a strategy, data set, model and compressor, flat, with one numeric
    setting (or duration, or rate) they read at an edge: 0, -1, huge, inf, nan, its bound and
    just past it; a per-worker list one value per worker."""
    names = {section: draw(st.sampled_from(sorted(kind.registry)))
             for section, kind in COMPONENTS.items()}
    read = {k for k, section in OWNERS.items() if section not in COMPONENTS}
    read |= {p.name for section, kind in COMPONENTS.items() for p in kind.params(names[section])}
    key = draw(st.sampled_from(sorted(read & {*NUMERIC, *TEXTUAL})))
    p = KEYS[key]
    if key in TEXTUAL:
        one = st.sampled_from(EDGE_TEXT[TEXTUAL[key]])
    else:
        kind = p.item or p.kind
        bound = [] if p.rule is None or p.rule.most is None else [  # its bound, and past it
            kind(p.rule.most), kind(p.rule.most) + (1 if kind is int else p.rule.most * 1e-9)]
        one = st.sampled_from([*(EDGE_INTS if kind is int else EDGE_FLOATS), *bound])
    size = default_workers() if key in ("worker_delay_s", "slowdown") else draw(
        st.integers(1, 2))
    values = {kind.name_key: names[s] for s, kind in COMPONENTS.items()}
    if "data_path" in read:  # cifar10, npz, csv: read at training
        values["data_path"] = "data"
    value = draw(st.lists(one, min_size=size, max_size=size) if p.kind is list else one)
    return {**values, **NEEDS.get(key, {}), key: value}


@budget(300)
@given(values=at_an_edge())
def test_edge_values_build_honoured_configs_or_one_line_errors(values: dict) -> None:
    build(values)


@budget(300)
@given(values=at_an_edge())
def test_edge_values_as_train_flags_are_honoured_or_one_line_errors(config_files: list[str],
                                                                   values: dict) -> None:
    run_cli(["train", *as_flags(values, KEYS)])  # accepted: the sentinel checks `honoured`


# Sweep files (`polyrhythm sweep FILE --dry-run` validates every point and runs nothing), with
# TOML's dates and integers of any size among their values (regression tests below).
sweep_scalars = ints | floats | strings | st.booleans() | st.dates()
sweep_values = st.recursive(sweep_scalars, lambda inner: arrays_and_tables(inner, junk_keys),
                            max_leaves=4)
grid_keys = st.sampled_from(sorted(KEYS)) | junk_keys
grid_entry = st.one_of(
    st.sampled_from(sorted(KEYS)).flatmap(lambda k: st.tuples(
        st.just(k), st.lists(usual(k, KEYS[k]) if KEYS[k] else PLAUSIBLE[k], max_size=3))),
    st.tuples(grid_keys, st.lists(st.dictionaries(grid_keys, sweep_values, max_size=2),
                                  max_size=2)),
    st.tuples(grid_keys, sweep_values))


EVERY_RUN_READS = sorted(["strategy", *(k for k, section in OWNERS.items()
                                        if section not in COMPONENTS)])


@st.composite
def sweep_files(draw) -> dict[str, Any]:
    """A sweep file: mostly a good one (a coherent base, a grid of usual values for a few
    fields), then sometimes one part swapped for anything or a junk key added."""
    base = draw(coherent())
    fields = draw(st.lists(st.sampled_from(EVERY_RUN_READS), min_size=1, max_size=2,
                           unique=True))
    grid = {k: draw(st.lists(usual(k, KEYS[k]) if KEYS[k] else PLAUSIBLE[k], min_size=1,
                             max_size=3)) for k in fields}
    out = {"name": draw(st.sampled_from(["fuzz", "a b"])), "repeats": draw(st.integers(1, 2)),
           "base": base, "grid": grid}
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        key = draw(st.sampled_from(["name", "description", "repeats", "base", "grid", "junk"]))
        out[key] = draw(st.one_of(sweep_values, st.lists(grid_entry, max_size=3).map(dict)))
    return out


@budget(300)
@given(data=sweep_files(), args=st.sampled_from([[], ["--out", "elsewhere"], ["--id", "x y"],
                                                ["--id", "ok-1"]]))
def test_sweep_files_are_accepted_or_one_line_errors(config_files: list[str], scratch: Path,
                                                     data: dict, args: list[str]) -> None:
    path = scratch / "sweep.toml"
    try:
        path.write_text(tomli_w.dumps(data), encoding="utf-8")
    except (TypeError, ValueError):  # tomli_w cannot write it: no TOML file holds it
        return
    run_cli(["sweep", str(path), "--dry-run", *args])


# --- damaged run stores ------------------------------------------------------------------------
# A store of one completed run and a sweep of it, written column by column (tests/hostile.py),
# then damaged: any value in any column (NULL, a blob, text where a count belongs, numbers
# out of range, ids that are paths), a column left out, rows gone, the summary's JSON
# damaged anywhere (a value replaced or removed), the config not TOML. `runs`, `runs --json`,
# `report --latest`, `simulate --calibrate` and --compute-from each read it or say in one
# line that it is damaged.

JUNK = st.one_of(
    st.none(), st.integers(-3, 5), st.sampled_from([2**31, 2**63 - 1, -(2**63)]),
    st.binary(max_size=6),
    st.sampled_from([math.inf, -math.inf, 0.5, -1.5, 1e308]),
    st.sampled_from(["", "x", "1", "2.5", "../escaped", "a/b", ".", "{", "[]", '{"a": 1}',
                     "[[1, 2]]", "[[\"k\", -1]]", "bsp", "completed", "running", "a\nb",
                     "nan", "strategy = 'bsp'\n[[x]]"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 3) | huge_ints.filter(lambda i: i < 2**64)
    | st.sampled_from([0.5, -1.0, 1e300, math.inf]) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3), max_leaves=6)
REMOVED = object()


def json_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (keys and list indexes), the value's own first."""
    inner = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    return [path, *(p for k, v in inner for p in json_paths(v, (*path, k)))]


def replaced(value: Any, path: tuple, new: Any) -> Any:
    """`value` with what is at `path` replaced by `new` (REMOVED: taken out); as it is if
    it has no such path (an earlier damage changed it)."""
    if not path:
        return new
    if not isinstance(value, dict | list) or path[0] not in (
            value if isinstance(value, dict) else range(len(value))):
        return value
    copy = dict(value) if isinstance(value, dict) else list(value)
    if len(path) == 1 and new is REMOVED:
        del copy[path[0]]
    else:
        copy[path[0]] = replaced(copy[path[0]], path[1:], new)
    return copy


def _json_or(text: Any) -> Any:
    """The JSON `text` holds, or (an earlier damage left none) the good summary."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return hostile.summary(Path("runs"))


SUMMARY_PATHS = json_paths(hostile.summary(Path("runs")))[1:]
COLUMNS_OF = hostile.store_columns()


@st.composite
def damaged_stores(draw) -> tuple[dict, dict]:
    """(the store's rows, a table's column left out): one to three damages."""
    tables = hostile.rows(Path("runs"))
    dropped: dict[str, str] = {}
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cell", "cell", "summary", "summary", "config",
                                     "column", "rows"]))
        table = draw(st.sampled_from(sorted(COLUMNS_OF)))
        if kind == "cell":
            column = draw(st.sampled_from(COLUMNS_OF[table]))
            for row in tables[table][:draw(st.sampled_from([1, len(tables[table])]))]:
                row[column] = draw(JUNK)
        elif kind == "summary":
            path = draw(st.sampled_from(SUMMARY_PATHS))
            new = draw(json_values | st.just(REMOVED))
            for run in tables["runs"]:  # none, if an earlier damage took the row out
                run["summary"] = json.dumps(replaced(_json_or(run["summary"]), path, new))
        elif kind == "config":
            text = draw(st.sampled_from(["", "[", "workers = 'x'", "a = 1" + "0" * 5000,
                                         "x = " + "[" * 2000, "[strategy]\nname = 5"])
                        | strings)
            for run in tables["runs"]:
                run["config"] = text
        elif kind == "column":
            dropped[table] = draw(st.sampled_from(COLUMNS_OF[table]))
        else:  # rows gone: all, or those of the second worker
            tables[table] = draw(st.sampled_from([
                [], [r for r in tables[table] if r.get("worker", 0) != 1]]))
    return tables, dropped


def run_reading(args: list[str]) -> None:
    """`polyrhythm ARGS` of a command that reads: its output and exit code 0, or one line on
    stderr and exit code 2."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    assert "Traceback" not in out.getvalue() + err.getvalue()
    if code == 0:
        event("read")
        return
    event("rejected")
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and "error: " in lines[0], (args, code, err.getvalue())


@pytest.fixture(scope="module")
def quick_drawing():
    """Figures drawn but not rendered to PNG (the rendering is what takes the time; it reads
    nothing of the store): a report's every figure still reads its data."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(polyrhythm.report.figures, "png", lambda fig: b"PNG")
        mp.setattr(polyrhythm.sim.plot, "scaling_png", lambda *a, **k: b"PNG")
        yield


@budget(STORE_EXAMPLES)
@given(damage=damaged_stores())
def test_damaged_stores_are_read_or_one_line_errors(quick_drawing, scratch: Path,
                                                    damage: tuple[dict, dict]) -> None:
    tables, dropped = damage
    out = scratch / "store"
    hostile.write_store(out, tables, dropped)
    run_reading(["runs", "--out", str(out)])
    run_reading(["runs", "--json", "--out", str(out)])
    run_reading(["report", "--latest", "--out", str(out)])
    run_reading(["simulate", "--calibrate", hostile.RUN_ID, "--out", str(out), "--plot",
                 str(scratch / "sim.png")])
    try:
        measured_compute(out, hostile.RUN_ID)
    except PolyrhythmError as exc:
        check_rejection(exc)


# --- mutated files -----------------------------------------------------------------------------
# A good file of each kind a reader takes (an .npz data set; a CSV table, plain, gzip and
# zip; CIFAR's pickled members in their folder and in a tar; a script run's script.json; a
# config), mutated: bytes flipped, the file cut short, bytes inserted or a span replaced,
# near its start (headers) or anywhere. Each reader takes it or says in one line why not.

def _npz(path: Path) -> None:
    source = NpzSource(SimpleNamespace(data_path=str(path)))
    source.check()
    source.labels()
    source.rows(np.arange(2))


def _cifar(path: Path) -> None:
    source = load_cifar100(SimpleNamespace(data_path=str(path), augment=False,
                                           labels="fine"), 0)
    source.check()
    source.rows(np.arange(2))


def _table(path: Path) -> None:
    read_table(path, "0")


def _script_call(path: Path) -> None:
    ScriptCall.recalled(path.parent)


def _config(path: Path) -> None:
    load_config(path)


Seeds = dict[str, tuple[bytes, Callable[[Path], None], str]]


@pytest.fixture(scope="module")
def seed_files(tmp_path_factory) -> tuple[Seeds, Path]:
    """({kind: (a good file's bytes, its reader, the file's name)}, the CIFAR folder a
    member goes into); each reader takes its good file."""
    root = tmp_path_factory.mktemp("seeds")
    folder, _ = write_cifar(root, "cifar100", train_rows=4, test_rows=2, archive=False)
    with tarfile.open(root / "cifar.tar", "w") as tar:
        tar.add(folder, arcname=folder.name)
    arrays, packed = io.BytesIO(), io.BytesIO()
    np.savez(arrays, x=np.arange(24, dtype=np.float32).reshape(4, 6), y=np.array([0, 1, 0, 1]))
    # deflated, and larger than a header's read: its data is read (and checked) by np.load
    np.savez_compressed(packed, x=np.arange(6000, dtype=np.float32).reshape(1000, 6),
                        y=np.arange(1000) % 2)
    table = b"label,a,b\n0,1.5,2\n1,2.5,3\n0,0.5,1\n"
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("table.csv", table)
    seeds = {
        "npz": (arrays.getvalue(), _npz, "data.npz"),
        "npz deflated": (packed.getvalue(), _npz, "data.npz"),
        "csv": (table, _table, "table.csv"),
        "csv.gz": (gzip.compress(table), _table, "table.csv.gz"),
        "csv.zip": (zipped.getvalue(), _table, "table.zip"),
        "cifar member": ((folder / "train").read_bytes(), _cifar, "train"),
        "cifar tar": ((root / "cifar.tar").read_bytes(), _cifar, "cifar.tar"),
        "script.json": (json.dumps({"script": "/x/train.py", "args": ["--steps", "4"],
                                    "cwd": "/x"}).encode(), _script_call, "script.json"),
        "config": (b'workers = 2\n[strategy]\nname = "ssp"\nstaleness = 1\n', _config,
                   "config.toml"),
    }
    for data, reader, name in seeds.values():  # good seeds: mutations start from files read
        reader(_placed(root / "good", name, data, folder))
    return seeds, folder


def _placed(where: Path, name: str, data: bytes, cifar: Path) -> Path:
    """`data` as file `name` in the folder `where` (made afresh; a CIFAR member beside the
    other members of `cifar`); the path a reader takes."""
    shutil.rmtree(where, ignore_errors=True)
    if name == "train":
        shutil.copytree(cifar, where)
        (where / name).write_bytes(data)
        return where
    where.mkdir(parents=True)
    (where / name).write_bytes(data)
    return where / name


mutations = st.lists(st.tuples(
    st.sampled_from(["flip", "cut", "insert", "replace"]),
    st.integers(0, 512) | st.integers(0, 2**20), st.binary(min_size=1, max_size=8)),
    min_size=1, max_size=3)


def mutated(data: bytes, operations: list[tuple[str, int, bytes]]) -> bytes:
    for operation, at, junk in operations:
        i = at % (len(data) + 1)
        if operation == "flip" and i < len(data):
            data = data[:i] + bytes([data[i] ^ junk[0] or 1]) + data[i + 1:]
        elif operation == "cut":
            data = data[:i]
        elif operation == "insert":
            data = data[:i] + junk + data[i:]
        else:
            data = data[:i] + junk + data[i + len(junk):]
    return data


@budget(FILE_EXAMPLES)
@given(kind=st.sampled_from(["npz", "npz deflated", "csv", "csv.gz", "csv.zip", "cifar member",
                             "cifar tar", "script.json", "config"]), operations=mutations)
def test_mutated_files_are_read_or_one_line_errors(seed_files, scratch: Path, kind: str,
                                                   operations: list) -> None:
    seeds, cifar = seed_files
    data, reader, name = seeds[kind]
    path = _placed(scratch / "mutated", name, mutated(data, operations), cifar)
    try:
        reader(path)
    except PolyrhythmError as exc:
        check_rejection(exc)
    else:
        event("accepted")


# --- regressions: one regular test per bug the fuzzing found -----------------------------------

@pytest.mark.parametrize("values, needles", [
    # OverflowError: an integer too large for a float, where a number is read
    ({"worker_delay_s": [10**400]}, ["worker_delay_s must be a valid number", "64 bits"]),
    ({"lr": 2**1100}, ["lr must be a valid number (at most 64 bits"]),
    # accepted beyond 64 bits, then OverflowError in the cluster's host count
    ({"workers": 10**400, "workers_per_host": 1}, ["workers must be a valid integer", "64 bits"]),
    # ValueError: the message's repr of an integer of more than 4,300 digits
    ({"workers": -(10**5000)}, ["workers must be a valid integer", "too long to show"]),
    ({"strategy": 10**5000}, ["strategy must be a valid string", "too long to show"]),
    ({"data": 10**5000}, ["data must be a table", "too long to show"]),
    # TypeError: unhashable type: a composed strategy's half named by a list or a table
    ({"strategy": "switch", "from": {"name": ["bsp"]}}, ["from must be a valid string",
                                                          "['bsp']"]),
    ({"strategy": {"name": "switch", "to": {"name": {"a": 1}}}}, ["to must be a valid string"]),
    # nan passed the range checks (min([0.0, nan]) is 0.0) or went where there are none
    ({"worker_delay_s": [0.0, math.nan]}, ["worker_delay_s must be a number, got nan"]),
    ({"lr_decay": math.nan}, ["lr_decay must be a number, got nan"]),
    # a junk key's line break, printed as it was: a message of two lines
    ({"strategy": {"name": "bsp", "a\nb": 1}}, ["unknown config key 'strategy.a\\nb'"]),
    ({"optimizer": {"x\x1ey": 1}}, ["unknown config key 'optimizer.x\\x1ey'"]),
    # with integers held to 64 bits, worker_batch_size x workers could still go beyond: a
    # config accepted whose stored batch_size (2**63) would not load back
    ({"worker_batch_size": 2**62, "workers": 2}, ["worker_batch_size", "beyond 64 bits"]),
    # 400 digits of milliseconds read as an infinite duration (and rate), accepted
    ({"latency": "9" * 400 + "ms"}, ["latency must be a duration"]),
    ({"hosts": 2, "workers": 2, "strategy": "allreduce", "bandwidth": "9" * 400 + "mbit"},
     ["bandwidth must have entries such as 100mbit"]),
])
def test_bad_values_found_by_fuzzing_are_one_line_errors(values: dict, needles: list) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig(**values)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("text, needle", [
    ("workers = 1" + "0" * 5000, "Exceeds the limit"),  # ValueError inside tomllib
    ("workers = " + "[" * 5000 + "]" * 5000, "nested too deeply"),  # RecursionError
    ('[strategy]\nname = "ssp"\n"a\\nb" = 1', "unknown config key 'strategy.a\\nb'"),
])
def test_toml_files_found_by_fuzzing_are_one_line_errors(tmp_path: Path, text: str,
                                                         needle: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(str(info.value).splitlines()) == 1 and needle in str(info.value)


def test_a_config_path_with_a_null_byte_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="cannot read config file 'a\\\\x00b': embedded null"):
        load_config("a\x00b")  # was ValueError from open()


@pytest.mark.parametrize("args, needle", [
    (["train", "a\nb"], "unrecognized arguments: a\\nb"),  # argparse quotes the words raw
    (["train", "\x0c"], "unrecognized arguments: \\x0c"),  # splitlines() breaks at \f too
    (["train", "--workers", "2", "--x\u2028"], "unrecognized arguments: --x\\u2028"),
    (["train", "--config", "a\x00b"], "embedded null byte"),  # was a traceback
    (["train", "--lr-decay", "nan"], "lr_decay must be a number, got nan"),  # was accepted
])
def test_flags_found_by_fuzzing_are_one_line_errors(capsys, args: list[str],
                                                    needle: str) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("grid", [{"workers": [datetime.date(2020, 1, 1)]},
                                  {"workers": [10**5000]}])
def test_sweep_values_json_cannot_show_are_one_line_errors(grid: dict) -> None:
    with pytest.raises(ConfigError):
        parse_sweep({"grid": grid})


def _zip_of(name: str, data: bytes, method: int = zipfile.ZIP_DEFLATED) -> bytearray:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as z:
        z.writestr(name, data)
    return bytearray(buffer.getvalue())


def _unsupported_method(name: str, data: bytes) -> bytes:
    """A zip whose member says it is compressed by method 99, which zipfile cannot read."""
    archive = _zip_of(name, data, zipfile.ZIP_STORED)
    for header, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # local, central
        start = archive.index(header)
        archive[start + at:start + at + 2] = (99).to_bytes(2, "little")
    return bytes(archive)


def _two_files(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name in names:
            z.writestr(name, b"y,x\n0,1\n")
    return buffer.getvalue()


def _encrypted(name: str, data: bytes) -> bytes:
    """A zip whose member says it is encrypted (general purpose flag bit 0)."""
    archive = _zip_of(name, data, zipfile.ZIP_STORED)
    for header, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local, central
        archive[archive.index(header) + at] |= 1
    return bytes(archive)


def _unclosed_header() -> bytes:
    """An .npy file whose header's dict has a bracket never closed."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': (".ljust(117)
    return b"\x93NUMPY\x01\x00" + (len(header) + 1).to_bytes(2, "little") + header + b"\n"


def _garbled_deflate(name: str, data: bytes) -> bytes:
    """A zip whose deflated member starts with a block of no valid type."""
    archive = _zip_of(name, data)
    start = 30 + int.from_bytes(archive[26:28], "little") + int.from_bytes(archive[28:30],
                                                                           "little")
    archive[start] = 0xFF
    return bytes(archive)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("name, data, read, needle", [
    # NotImplementedError from zipfile: a compression method it does not read
    ("t.zip", _unsupported_method("t.csv", b"y,x\n0,1\n1,2\n"), _table,
     "compression method is not supported"),
    ("d.npz", _unsupported_method("x.npy", _npy(np.zeros((2, 2)))), _npz,
     "compression method is not supported"),
    # zlib.error reading an .npz member's header
    ("d.npz", _garbled_deflate("x.npy", _npy(np.zeros((2, 2)))), _npz, "invalid block type"),
    # RuntimeError from zipfile: a member it says is encrypted
    ("t.zip", _encrypted("t.csv", b"y,x\n0,1\n1,2\n"), _table, "password required"),
    ("d.npz", _encrypted("x.npy", _npy(np.zeros((2, 2)))), _npz, "password required"),
    # tokenize.TokenError from numpy's parse of a header whose bracket is never closed
    ("d.npz", bytes(_zip_of("x.npy", _unclosed_header())), _npz, "member x.npy"),
    # a file's own names with a line break in the listing of what it holds
    ("d.npz", bytes(_zip_of("\u2261\rpy", _npy(np.zeros(2)))), _npz, "it has '≡\\rpy'"),
    ("t.zip", _two_files("a\nb.csv", "c.csv"), _table, "holds 2 files ('a\\nb.csv', c.csv)"),
    ("t.csv", b"y,a\x0cb\n0,1\n1,2\n", lambda path: read_table(path, "q"),
     "its columns: y, 'a\\x0cb'"),
])
def test_files_found_by_fuzzing_are_one_line_errors(tmp_path: Path, name: str, data: bytes,
                                                    read, needle: str) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(PolyrhythmError) as info:
        read(tmp_path / name)
    assert len(str(info.value).splitlines()) == 1 and needle in str(info.value), info.value


def test_a_pickle_naming_a_global_with_a_line_break_is_one_line() -> None:
    """A damaged CIFAR member naming `_codecs\\x0cx.encode` (a form feed: splitlines breaks
    there): the refusal quotes it."""
    with pytest.raises(DataError) as info:
        restricted_loads(b"c_codecs\x0cx\nencode\n.", "member")
    assert str(info.value) == ("member: refuses to unpickle '_codecs\\x0cx.encode': a CIFAR "
                               "pickle holds only dicts, lists, bytes, numbers and numpy arrays")
