"""The README is the front door: its tables follow the declarations (every flag with its
default, every strategy with its source, every data set and model), and it keeps its two
commands."""

import re
from pathlib import Path

from polyrhythm.config import COMPONENTS, flat_keys
from polyrhythm.data import DATASETS
from polyrhythm.models import MODELS
from polyrhythm.strategies import STRATEGIES

README = (Path(__file__).parent.parent / "README.md").read_text()


def flag_rows() -> dict[str, tuple[str, str]]:
    """Flags table: key -> (default cell, meaning cell)."""
    rows = {}
    for line in README.splitlines():
        m = re.match(r"\| `--[a-z-]+` / `([a-z_]+)` \|\s*(.*?)\s*\|\s*(.*?)\s*\|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_readme_documents_every_config_key_with_its_declared_defaults():
    rows = flag_rows()
    for key in flat_keys():
        assert f"`--{key.replace('_', '-')}` / `{key}`" in README, key
    for kind in COMPONENTS.values():
        assert f"`{kind.default}`" in rows[kind.name_key][0], kind.name_key
        for name in kind.registry.param_names():
            for component, param in kind.registry.declarations(name):
                assert param.default_text() in rows[name][0], (name, component.name)
                assert f"`{component.name}`" in " ".join(rows[name]), (name, component.name)
    for key, param in flat_keys().items():
        if param is not None and param.default_text():
            assert param.default_text() in rows[key][0], (key, rows[key][0])


def test_readme_documents_every_strategy_with_its_source():
    for spec in STRATEGIES.values():
        row = next((line.strip() for line in README.splitlines()
                    if line.strip().startswith(f"| `{spec.name}` |")), None)
        assert row is not None, spec.name
        assert row.endswith(f"| {spec.source} |"), (spec.name, spec.source)


def test_readme_documents_every_data_set_and_model():
    for name in [*DATASETS, *MODELS]:
        assert f"| `{name}` |" in README, name


def test_readme_opens_with_the_two_set_up_commands():
    first_block = README.split("```sh", 1)[1].split("```", 1)[0]
    assert "make demo" in first_block and "make test" in first_block
