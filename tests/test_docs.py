"""The README is the front door: its tables follow the declarations (every flag with its
default, every strategy with its source, every data set and model), and it keeps its two
commands."""

import contextlib
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


# A study cited by its file number ("004 ch. 4", "as 004 reports"): users do not have those
# files. Numbers such as 5,000, 0.004 or 2004 are not matched.
NUMBERED_CITATION = re.compile(r"(?<![\w.,])00[0-4](?![\w.,%])")


def test_the_studies_are_cited_by_name_in_a_references_section():
    references = README.split("\n## References\n", 1)
    assert len(references) == 2, "the README has no References section"
    for name in ("ResNet-50 CPU scaling thesis", "Jia et al.", "Shi (2019)",
                 "Nam's parameter-server lectures", "Strategy-Switch thesis"):
        assert f"**{name}**" in references[1] or name in references[1], name
    texts = {"README.md": README}
    root = Path(__file__).parent.parent
    texts |= {str(p): p.read_text() for p in (root / "experiments").glob("*.toml")}
    texts |= {f"source of {spec.name}": spec.source or ""
              for spec in [*STRATEGIES.values(), *DATASETS.values(), *MODELS.values()]}
    for where, text in texts.items():
        cited = [line for line in text.splitlines() if NUMBERED_CITATION.search(line)]
        assert not cited, (where, cited[:3])


def test_help_texts_cite_no_study_by_number(capsys):
    from polyrhythm.cli import COMMANDS, listing, main

    argvs = [["--help"], *([c, "--help"] for c in COMMANDS), *([c] for c in listing.COMMANDS)]
    for argv in argvs:
        command = " ".join(argv)
        with contextlib.suppress(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert out, command
        assert not NUMBERED_CITATION.search(out), (command, NUMBERED_CITATION.findall(out))
