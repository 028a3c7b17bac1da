"""A config's sections: which sections name a component (COMPONENTS), which section owns
each parameter, and configs given as flat keys, sections or both, layered and flattened."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression import SHARED as COMPRESSION_SHARED
from polyrhythm.config.declared import GENERAL, OPTIMIZER
from polyrhythm.config.emulation import CLUSTER
from polyrhythm.data import DATASETS, SHARDING, VAL_FRACTION, check_sharding
from polyrhythm.errors import ConfigError
from polyrhythm.metrics.records import NAME_KEYS, SECTIONS, flatten, from_release_0_1
from polyrhythm.models import MODELS
from polyrhythm.settings import Param, Registry, Settings, shown
from polyrhythm.strategies import STRATEGIES


class Kind(NamedTuple):
    """A section that names a component: where its components are registered, which one a
    config gets by default, the flat key that names it, and the parameters all of them read."""

    registry: Registry
    default: str
    name_key: str
    shared: tuple[Param, ...] = ()
    check: Callable[[Settings], str | None] | None = None  # of the shared parameters

    def params(self, name: str) -> tuple[Param, ...]:
        """What the component `name` reads: the shared parameters and its own."""
        return (*self.shared, *self.registry[name].params)


COMPONENTS = {
    "strategy": Kind(STRATEGIES, "bsp", NAME_KEYS["strategy"]),
    "data": Kind(DATASETS, "mnist5k", NAME_KEYS["data"], (VAL_FRACTION, *SHARDING),
                 check_sharding),
    "model": Kind(MODELS, "cnn", NAME_KEYS["model"]),
    "compression": Kind(COMPRESSORS, "none", NAME_KEYS["compression"], COMPRESSION_SHARED),
}


def owners() -> dict[str, str]:
    """Every parameter's name -> its section ("" for the general settings). A name declared
    in two sections is a programming error (their flags would collide)."""
    found = ({p.name: "" for p in GENERAL} | {p.name: "optimizer" for p in OPTIMIZER}
             | {p.name: "cluster" for p in CLUSTER})
    for section, kind in COMPONENTS.items():
        for name in [p.name for p in kind.shared] + kind.registry.param_names():
            if found.setdefault(name, section) != section:
                raise ValueError(f"parameter {name!r} is declared in two sections "
                                 f"({found[name] or 'general'} and {section}): rename one")
    return found


def sectioned(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat keys, sections or both, as sections: {general keys..., "strategy": {...},
    "data": {...}, "model": {...}, "optimizer": {...}}. A key given twice is an error."""
    values = from_release_0_1(dict(values))
    out: dict[str, Any] = {section: {} for section in SECTIONS}
    found = owners()
    names = {name_key: section for section, name_key in NAME_KEYS.items()}

    def put(section: str, key: str, value: Any) -> None:
        target = out[section] if section else out
        if key in target:
            shown = f"{section}.{key}" if section else key
            raise ConfigError(f"{shown} is given twice")
        target[key] = value

    for key, value in values.items():
        if key in SECTIONS and isinstance(value, Mapping):
            for k, v in value.items():
                # [optimizer] name is the `optimizer` setting (no component registry of its own).
                put(key, "optimizer" if (key, k) == ("optimizer", "name") else k, v)
        elif key in names:
            put(names[key], "name", value)
        elif key in found:
            put(found[key], key, value)
        elif key in SECTIONS:
            hint = f"; or {NAME_KEYS[key]} = ..." if key in NAME_KEYS else ""
            raise ConfigError(f"{key} must be a table ([{key}]){hint}, got {shown(value)}")
        else:
            raise ConfigError(f"unknown config key {key!r}")
    return out


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Two sectioned configs, `over` winning key by key (within sections too)."""
    out = {**base, **{k: v for k, v in over.items() if k not in SECTIONS}}
    for section in SECTIONS:
        out[section] = {**base.get(section, {}), **over.get(section, {})}
    return out


def flat_keys() -> dict[str, Param | None]:
    """Every flat key a config, a flag or a sweep may set -> its declaration (None for the
    keys that name a component: strategy, dataset, model). Declarations shared by several
    components (quorum) give the first."""
    owners()  # no name in two sections: one key, one meaning
    keys: dict[str, Param | None] = dict.fromkeys(NAME_KEYS.values())
    for p in (*GENERAL, *OPTIMIZER, *CLUSTER,
              *(p for kind in COMPONENTS.values() for p in kind.shared)):
        keys[p.name] = p
    for kind in COMPONENTS.values():
        for name in kind.registry.param_names():
            keys.setdefault(name, kind.registry.declarations(name)[0][1])
    return keys


def layered(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Configs in sections, flat or both, the later ones winning key by key (a file, then
    flags), as one config in sections. A key given twice within one layer is an error."""
    combined: dict[str, Any] = {}
    for layer in layers:
        combined = merged(combined, sectioned(layer))
    return combined


def flat_config(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """`layered` as flat keys, as sweeps and comparisons combine configs."""
    return flatten(layered(*layers))
