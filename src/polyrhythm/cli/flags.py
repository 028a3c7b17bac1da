"""Command-line flags of a run, made from the declarations alone: one flag per general and
optimizer setting, one per component (--strategy, --dataset, --model, --compress) and one per
parameter some strategy, data set, model or compressor declares (--tau for localsgd and easgd)."""

from __future__ import annotations

import argparse
import typing
from typing import Any

from polyrhythm.config import CLUSTER, COMPONENTS, GENERAL, OPTIMIZER, flat_keys
from polyrhythm.settings import Param

_SUMMARIES = {"strategy": "consistency strategy (see `polyrhythm strategies`)",
              "data": "data set (see `polyrhythm datasets`)",
              "model": "model (see `polyrhythm models`)",
              "compression": "compressor of gradients, replies and model exchanges (see "
                             "`polyrhythm compressors`)"}


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits with 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped as repr() shows
    them: argparse quotes the user's words as they are ("unrecognized arguments: a\\nb")."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def metavar(p: Param) -> str:
    kind = p.item if p.kind is list else p.kind
    return p.metavar or {int: "N", float: "X", str: "NAME"}.get(kind, "VALUE")


def usage(p: Param) -> str:
    """How a setting is written on the command line: `--tau N`, or a switch alone
    (`--augment`; `--no-augment` too), as add_flag's parser takes it."""
    return p.flag if p.kind is bool else f"{p.flag} {metavar(p)}"


def default_text(p: Param) -> str:
    text = p.default_text()
    return f" (default: {text})" if text else ""


def add_flag(parser: argparse.ArgumentParser, p: Param, help_text: str) -> None:
    """The flag of one declared setting, typed from its declaration (unset: None)."""
    if p.kind is bool:
        parser.add_argument(p.flag, dest=p.name, default=None,
                            action=argparse.BooleanOptionalAction, help=help_text)
        return
    kwargs: dict[str, Any] = {"dest": p.name, "default": None, "metavar": metavar(p),
                              "type": p.kind, "help": help_text}
    if p.kind is list:
        kwargs |= list_of(p.item)
    parser.add_argument(p.flag, **kwargs)


def list_of(kind: type) -> dict[str, Any]:
    """add_argument's keywords for a list flag, written the one way every command takes a
    list: `--slowdown 1 1 3`, `--slowdown 1,1,3` or both. Its default must be None (the
    entries given are added to what is there)."""
    return {"nargs": "+", "action": _Entries, "type": _items(kind)}


class _Entries(argparse.Action):
    """A list flag's words, each a list of entries, as one list (given twice: both)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        entries = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, entries + [x for word in values for x in word])


def _items(kind: type):
    """One command-line word of a list flag: one entry, or several joined by commas."""
    def parse(word: str) -> list:
        return [kind(part.strip()) for part in word.split(",") if part.strip()]
    parse.__name__ = kind.__name__  # argparse names it in "invalid float value: ..."
    return parse


def add_component_flags(parser: argparse.ArgumentParser, section: str, exclude: tuple = (),
                        shared: bool = True) -> None:
    """The flags of a component section: the one naming it (--dataset), the parameters all
    its components read (`shared`: --val-fraction, --sharding ...) and each one's own."""
    kind = COMPONENTS[section]
    registry, flat = kind.registry, kind.name_key
    if flat not in exclude:
        parser.add_argument(f"--{flat}", dest=flat, default=None, metavar="NAME",
                            help=f"{_SUMMARIES[section]} (default: {kind.default})")
    for p in kind.shared if shared else ():
        add_flag(parser, p, p.help + default_text(p))
    for name in registry.param_names():
        declared = registry.declarations(name)
        first = declared[0][1]
        owners = ", ".join(c.name for c, _ in declared)
        defaults = {p.default_text() for _, p in declared}
        if len(defaults) > 1:  # per-component defaults: quorum
            shown = ", ".join(f"{p.default_text()} for {c.name}" for c, p in declared)
            help_text = f"{owners}: {first.help} (default: {shown})"
        else:
            help_text = f"{owners}: {first.help}{default_text(first)}"
        add_flag(parser, first, help_text)


def add_config_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per flat config key (--batch-size for batch_size), typed from its declaration."""
    add_component_flags(parser, "strategy", exclude)
    for p in (*GENERAL, *OPTIMIZER, *CLUSTER):
        if p.name not in exclude:
            add_flag(parser, p, p.help + default_text(p))
    add_component_flags(parser, "data", exclude)
    add_component_flags(parser, "model", exclude)
    add_component_flags(parser, "compression", exclude)


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys given as flags (those a command has and the user set)."""
    return {key: value for key in flat_keys()
            if (value := getattr(args, key, None)) is not None}
