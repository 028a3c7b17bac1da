"""A composed component's settings given flat: `--strategy switch --to ssp --staleness 2`.

A composed strategy holds other strategies as settings of its own (Strategy-Switch's `from`
and `to`, each a `Param` with a section). A key the composed strategy does not read itself
belongs to the half whose strategy reads it, so the halves' own flags work as they would
alone; a key both halves read must be given in the half's table, where it is not ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrhythm.errors import ConfigError
from polyrhythm.settings import Registry


def into_halves(values: Mapping[str, Any], registry: Registry, default: str) -> dict[str, Any]:
    """`values` (one component's section, as given) with each key its component does not
    read moved into the table of the one half that does. Anything else stays where it is,
    for the component's own checks to name."""
    name = values.get("name", default)
    if not isinstance(name, str) or name not in registry:
        return dict(values)
    halves = [p for p in registry[name].params if p.section is not None]
    own = {p.name for p in registry[name].params} | {"name"}
    out = {k: v for k, v in values.items() if k in own}
    tables = {}
    for half in halves:
        value = out.get(half.name, half.default)
        table = {"name": value} if isinstance(value, str) else value
        if isinstance(table, Mapping) and table.get("name") in registry:
            tables[half.name] = dict(table)
    for key, value in values.items():
        if key in own:
            continue
        readers = [h for h, table in tables.items()
                   if key in {p.name for p in registry[table["name"]].params}]
        if len(readers) > 1:
            raise ConfigError(f"{key} is read by both {name}'s {' and '.join(readers)}; give "
                              f"it in [strategy.{readers[0]}] or [strategy.{readers[1]}]")
        if not readers:
            out[key] = value
            continue
        table = tables[readers[0]]
        if key in table:
            raise ConfigError(f"{key} is given twice (flat and in [strategy.{readers[0]}])")
        table[key] = value
        out[readers[0]] = table
    return out
