"""Declared settings: every setting of a run is a `Param`, declared by the piece that reads it.

A strategy, a data set and a model each declare their own parameters (`Component.params`);
the run's general settings are declared in config.py. From the declarations alone come the
command-line flags, the type and range checks with their one-line errors, the "strategy X
takes no --y" errors, the listings (`polyrhythm strategies`) and the README's table check.

A `Registry` holds the components of one kind by name. A component's code may be named
lazily as "package.module:attribute", so that declaring it (and listing it, or checking a
config against it) imports neither torch nor the module that implements it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from polyrhythm.errors import ConfigError

_KIND_NAMES = {int: "integer", float: "number", bool: "boolean (true or false)", str: "string"}
_INT_RANGE = range(-(2**63), 2**63)  # TOML's integers: 64-bit signed


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, even for an integer too long to
    print (Python refuses str() of more than 4,300 digits)."""
    try:
        return repr(value)
    except ValueError:
        return "a number too long to show"


@dataclass(frozen=True)
class Rule:
    """A range rule: `holds(value, run)` is true for valid values; `text(run)` completes
    '<name> must ...' in the error and the listings ('be at least 1'). `most` bounds the
    values it accepts from above (each entry's, for a list; in seconds or bits per second,
    for a duration or a rate), where it has a bound: what a run can honour (limits.py)."""

    holds: Callable[[Any, Any], bool]
    text: Callable[[Any], str]
    most: float | None = None


def number(value: float) -> str:
    """A bound as a rule's text shows it: 65536, 0.001, 1e+38."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def _and_at_most(most: float | None) -> str:
    return "" if most is None else f" (and at most {number(most)})"


def at_least(low: float, most: float | None = None) -> Rule:
    """low <= v, and v <= most if given: 'be at least 1 (and at most 1024)'."""
    return Rule(lambda v, run: low <= v and (most is None or v <= most),
                lambda run: f"be at least {number(low)}{_and_at_most(most)}", most)


def positive(most: float | None = None) -> Rule:
    return Rule(lambda v, run: v > 0 and (most is None or v <= most),
                lambda run: f"be positive{_and_at_most(most)}", most)


def within(low: float, high: float, *, low_open: bool = False,
           high_open: bool = False) -> Rule:
    """low <= v <= high, either end open: 'be in (0, 1]'."""
    def holds(v, run) -> bool:
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    text = (f"be in {'(' if low_open else '['}{number(low)}, {number(high)}"
            f"{')' if high_open else ']'}")
    return Rule(holds, lambda run: text, high)


def one_of(*choices: str) -> Rule:
    return Rule(lambda v, run: v in choices, lambda run: f"be one of {', '.join(choices)}")


def each(test: Callable[[Any], bool], text: str, most: float | None = None) -> Rule:
    """A rule on every entry of a list: 'have entries that <text>' (`most`: the largest
    entry it accepts)."""
    return Rule(lambda v, run: all(test(x) for x in v), lambda run: f"have entries {text}",
                most)


@dataclass(frozen=True)
class Param:
    """One setting: its name (the config key; the flag is --name-with-dashes), its type, a
    one-line help, a default (or `derive(run)`, a default that depends on the run, shown as
    `derived` in listings; `derived` alone describes a default the config resolves itself)
    and an optional range rule. `kind` is int, float, bool, str or
    list (of `item`). A default of None with no `derive` means "not set" (optional).

    With `section` ("strategy", ...), the value is a component of that section with settings
    of its own: its name, or a table of its name and parameters (a composed strategy's
    halves); the config resolves it as it does the section itself.

    A list with `single` also takes one value, as a list of it (`bandwidth = "100mbit"`: one
    rate for every host)."""

    name: str
    kind: type
    help: str
    default: Any = None
    derive: Callable[[Any], Any] | None = None
    derived: str = ""
    rule: Rule | None = None
    item: type | None = None
    metavar: str | None = None
    section: str | None = None
    single: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value: Any) -> Any:
        """The value, type-checked strictly (an int is a number, a bool is not an integer)."""
        if value is None:
            return None
        if self.section is not None:
            if not isinstance(value, str | dict):
                raise ConfigError(f"{self.name} must be a {self.section} name or a table of "
                                  f"its settings, got {shown(value)}")
            return value
        if self.kind is list:
            if self.single and not isinstance(value, list):
                value = [value]
            if not isinstance(value, list):
                raise ConfigError(f"{self.name} must be a list of {_KIND_NAMES[self.item]}s, "
                                  f"got {shown(value)}")
            return [_scalar(self.name, self.item, v) for v in value]
        return _scalar(self.name, self.kind, value)

    def resolve(self, value: Any, run: Any) -> Any:
        """The value given (parsed and checked) or its default for this run."""
        value = self.parse(value)
        if value is None:
            value = self.derive(run) if self.derive else self.default
        elif self.rule is not None and not self.rule.holds(value, run):
            raise ConfigError(f"{self.name} must {self.rule.text(run)}, got {shown(value)}")
        return value

    def default_text(self) -> str:
        """How the default reads in listings and help ('' when there is none)."""
        if self.derive is not None or self.derived:
            return self.derived
        if self.default is None or self.default == []:
            return ""
        if self.kind is list:
            return " ".join(str(v) for v in self.default)
        if self.kind is bool:
            return "on" if self.default else "off"
        return str(self.default)


def _scalar(name: str, kind: type, value: Any) -> Any:
    if type(value) is int and kind in (int, float) and value not in _INT_RANGE:
        raise ConfigError(f"{name} must be a valid {_KIND_NAMES[kind]} (at most 64 bits, as "
                          f"in TOML), got {shown(value)}")
    if kind is float and type(value) in (int, float):
        if math.isnan(value):  # TOML's nan, or --lr nan: it passes no range check
            raise ConfigError(f"{name} must be a number, got nan")
        if math.isinf(value):  # no setting means "forever" by inf; sleeps and timers overflow
            raise ConfigError(f"{name} must be a finite number, got {value}")
        return float(value)
    if type(value) is kind:
        return value
    raise ConfigError(f"{name} must be a valid {_KIND_NAMES[kind]}, got {shown(value)}")


@dataclass(frozen=True)
class Component:
    """Something a run names and configures: a strategy, a data set or a model. `source` is
    the paper (or project) it comes from; `params` are the settings it reads; `check(settings,
    run)` returns what is wrong with a combination of them (one line), or None."""

    name: str
    summary: str
    params: tuple[Param, ...] = ()
    source: str = ""
    check: Callable[[Any, Any], str | None] | None = None


C = TypeVar("C", bound=Component)


class Registry(Generic[C]):
    """The components of one kind ("strategy", "dataset", "model") by name. A new one is
    one `register` call; nothing else needs to know of it.

    With `custom`, a name of the form "package.module:function" is also valid: the user's
    own component, `custom(name)` making its declaration (imported only when used)."""

    def __init__(self, kind: str, custom: Callable[[str], C] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, C] = {}
        self._custom = custom

    def register(self, component: C) -> C:
        if component.name in self._entries:
            raise ValueError(f"{self.kind} {component.name!r} is already registered")
        names = [p.name for p in component.params]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.kind} {component.name!r} declares a parameter twice")
        for p in component.params:
            for other, q in self.declarations(p.name):
                if (q.kind, q.item) != (p.kind, p.item):
                    raise ValueError(f"{self.kind} {component.name!r} declares {p.name} as "
                                     f"{p.kind.__name__}, {other.name!r} as {q.kind.__name__}")
        self._entries[component.name] = component
        return component

    def unregister(self, name: str) -> None:
        del self._entries[name]

    def lookup(self, name: str) -> C:
        """The component, or a one-line ConfigError listing the valid names."""
        if name not in self:
            own = " or package.module:function" if self._custom else ""
            raise ConfigError(f"unknown {self.kind} {name!r}; valid: "
                              f"{', '.join(sorted(self))}{own}")
        return self[name]

    def get(self, name: str, default: C | None = None) -> C | None:
        return self[name] if name in self else default  # noqa: SIM401 (custom names)

    def __getitem__(self, name: str) -> C:
        if name not in self._entries and self._custom and is_reference(name):
            return self._custom(name)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):  # a name from a config may be a list, a table, ...
            return False
        return name in self._entries or (self._custom is not None and is_reference(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> list[C]:
        return list(self._entries.values())

    def declarations(self, name: str) -> list[tuple[C, Param]]:
        """Every (component, its declaration) of the parameter `name`."""
        return [(c, p) for c in self._entries.values() for p in c.params if p.name == name]

    def param_names(self) -> list[str]:
        """Every parameter some component declares, in registration order."""
        return list(dict.fromkeys(p.name for c in self._entries.values() for p in c.params))


class Settings(Mapping[str, Any]):
    """Validated values of one section (a strategy's, the optimizer's, ...), read as
    attributes: `settings.tau`. A component's section also has its `name`."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        # Through __dict__: while unpickling or copying, _values does not exist yet.
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only")

    def __reduce__(self) -> tuple:
        return Settings, (self._values,)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._values!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(repr(sorted(self._values.items(), key=lambda kv: kv[0])))

    def to_dict(self) -> dict[str, Any]:
        """Plain values, unset ones (None) left out, nested settings as tables."""
        return {k: v.to_dict() if isinstance(v, Settings) else v
                for k, v in self._values.items() if v is not None}


def is_reference(name: object) -> bool:
    """Whether `name` reads as "package.module:attribute"."""
    if not isinstance(name, str):
        return False
    module, colon, attribute = name.partition(":")
    return bool(colon and attribute.isidentifier()
                and all(part.isidentifier() for part in module.split(".")))


def load_object(ref: str | Callable[..., Any]) -> Any:
    """The object a reference names: "package.module:attribute", or the object itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except Exception as exc:  # the user's module may fail in any way while importing
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot load {ref!r}: {reason}") from None
