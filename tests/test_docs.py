"""The README is the front door: its tables follow the declarations (every flag with its
default, every strategy with its source, every data set and model), and it keeps its two
commands."""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

from polyrhythm.compression import COMPRESSORS
from polyrhythm.config import COMPONENTS, flat_keys, load_config
from polyrhythm.data import DATASETS
from polyrhythm.launch.rank.torchrun import host_of_this_rank
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


def test_readme_states_the_range_of_every_bounded_setting():
    """A setting whose range has a bound (what a run can honour: limits.py) says it in its
    row, in its declaration's own words."""
    rows = flag_rows()
    for key, param in flat_keys().items():
        if param is None or param.rule is None or param.rule.most is None:
            continue
        words = param.rule.text(None).removeprefix("be ").removeprefix("have ")
        assert words in rows[key][1], (key, words)


def test_readme_documents_every_strategy_with_its_source():
    for spec in STRATEGIES.values():
        row = next((line.strip() for line in README.splitlines()
                    if line.strip().startswith(f"| `{spec.name}` |")), None)
        assert row is not None, spec.name
        assert row.endswith(f"| {spec.source} |"), (spec.name, spec.source)


def test_readme_documents_every_compressor_with_its_source():
    for spec in COMPRESSORS.values():
        row = next((line.strip() for line in README.splitlines()
                    if line.strip().startswith(f"| `{spec.name}` |")), None)
        assert row is not None, spec.name
        assert row.endswith(f"| {spec.source} |" if spec.source else "| |"), spec.name


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


def _outside_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks; a fence reads as blank."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            line = ""
        lines.append((number, "" if fenced else line))
    return lines


def loose_tables(text: str) -> list[int]:
    """Line numbers of the tables that touch other text: a Markdown table (a run of lines
    starting with '|') runs on into a line right after it, and a line right before it makes
    its header a paragraph's, so each needs a blank line on both sides."""
    lines = _outside_code(text)
    is_row = [line.lstrip().startswith("|") for _, line in lines]
    loose = []
    for i, (number, _) in enumerate(lines):
        starts = is_row[i] and (i == 0 or not is_row[i - 1])
        ends = is_row[i] and (i + 1 == len(lines) or not is_row[i + 1])
        if starts and i > 0 and lines[i - 1][1].strip():
            loose.append(number)
        if ends and i + 1 < len(lines) and lines[i + 1][1].strip():
            loose.append(number)
    return loose


def test_every_table_in_the_readme_stands_apart_from_the_text():
    assert loose_tables(README) == []
    # The check sees a table that runs into the next line, and text glued on above one.
    assert loose_tables("text\n\n| a |\n|---|\n| 1 |\nmore text\n") == [5]
    assert loose_tables("text\n| a |\n|---|\n\n```\n| code |\n```\n") == [2]


def section(title: str) -> str:
    """One '## title' section of the README, up to the next."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_torchrun_examples_start_the_processes_their_config_places(tmp_path, monkeypatch):
    """Each torchrun line of the README names a config shown beside it, and starts the nodes
    and processes per node that config places (the checks each rank makes as it starts)."""
    text = section("Several machines with torchrun")
    configs = {}
    for block in re.findall(r"```toml\n(.*?)```", text, re.S):
        name = re.match(r"# (\S+\.toml)\n", block).group(1)
        (tmp_path / name).write_text(block)
        configs[name] = load_config(tmp_path / name)
    commands = re.findall(r"torchrun (.*?)-m polyrhythm\.node (\S+)", text.replace("\\\n", " "))
    # A resume names the config a run stored (runs/RUN_ID/config.toml), not one shown here.
    commands = [(flags, name) for flags, name in commands if not name.startswith("runs/")]
    assert len(commands) == 3 and {name for _, name in commands} == set(configs)
    for flags, name in commands:
        config = configs[name]
        nodes = int(re.search(r"--nnodes (\d+)", flags).group(1)) if "--nnodes" in flags else 1
        per_node = int(re.search(r"--nproc-per-node (\d+)", flags).group(1))
        assert nodes * per_node == config.world_size, (name, flags)
        for node in range(nodes):
            for key, value in (("GROUP_RANK", node), ("GROUP_WORLD_SIZE", nodes),
                               ("RANK", node * per_node), ("LOCAL_RANK", 0),
                               ("LOCAL_WORLD_SIZE", per_node)):
                monkeypatch.setenv(key, str(value))
            assert len(host_of_this_rank(config)) == per_node, (name, flags)



USER_MODULE = """
import numpy as np

def blobs(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, 90)
    return (rng.standard_normal((90, 4)) + y[:, None]).astype("float32"), y

def halves(data, workers, seed, settings):
    return [list(range(w, len(data.labels), workers)) for w in range(workers)]
"""


def test_a_users_functions_are_found_on_pythonpath_not_in_the_current_directory(tmp_path):
    """As Data and models says: the current directory is not on the path of the polyrhythm
    command (an installed script; `-P` does the same for `python -m`), so a module there is
    one line and exit 2 until PYTHONPATH names its folder."""
    (tmp_path / "mydata.py").write_text(USER_MODULE)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

    def shard(*pythonpath: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *pythonpath])}
        return subprocess.run([sys.executable, "-P", "-m", "polyrhythm.cli", "shard",
                               "--dataset", "mydata:blobs", "--sharding", "mydata:halves",
                               "--workers", "2"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    missing = shard()
    assert missing.returncode == 2 and missing.stderr == (
        "polyrhythm: error: cannot load 'mydata:blobs': No module named 'mydata'\n")
    found = shard(str(tmp_path))
    assert found.returncode == 0, found.stderr
    assert "mydata:blobs, 2 workers, sharding mydata:halves" in found.stdout
