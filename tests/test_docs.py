"""The README is the front door: it must document every flag and keep its two commands."""

from pathlib import Path

from polyrhythm.config import flat_keys
from polyrhythm.strategies import STRATEGIES

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_documents_every_config_field_as_flag_and_key():
    for name in flat_keys():
        assert f"`--{name.replace('_', '-')}` / `{name}`" in README, name


def test_readme_documents_every_strategy():
    for name in STRATEGIES:
        assert f"| `{name}` |" in README, name


def test_readme_opens_with_the_two_set_up_commands():
    first_block = README.split("```sh", 1)[1].split("```", 1)[0]
    assert "make demo" in first_block and "make test" in first_block
