"""The import contracts (pyproject.toml, checked by `lint-imports` in `make test`) hold, and
break when code crosses a layer: checked on a copy of the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on a tree (its pyproject.toml, its src/ first on the path)."""
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(tree / "src"), "PATH": ""})


def copy_tree(to: Path) -> Path:
    shutil.copytree(ROOT / "src", to / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", to)
    return to


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return copy_tree(tmp_path / "tree")


def test_the_tree_keeps_every_contract(tree):
    done = lint(tree)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def add_import(module: Path, line: str) -> None:
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    module.write_text(text.replace(marker, marker + "\n" + line + "\n", 1) if marker in text
                      else line + "\n" + text)


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("strategies/allreduce.py", "import torch.distributed as dist",
     "polyrhythm.strategies.allreduce -> torch.distributed"),
    ("sim/__init__.py", "from polyrhythm.comm.transport import Transport",
     "polyrhythm.sim -> polyrhythm.comm.transport"),
    ("strategies/cadence.py", "from polyrhythm.runtime.worker import builtin",
     "polyrhythm.strategies.cadence -> polyrhythm.runtime.worker.builtin"),
    ("launch/process/failures.py", "from polyrhythm.launch.rank import gate",
     "polyrhythm.launch.process.failures -> polyrhythm.launch.rank.gate"),
    ("runtime/server/bucket.py", "from polyrhythm.runtime.worker import engine",
     "polyrhythm.runtime.server.bucket -> polyrhythm.runtime.worker.engine"),
])
def test_the_contracts_break_when_a_module_crosses_a_layer(tree, module, line, broken):
    add_import(tree / "src" / "polyrhythm" / module, line)
    done = lint(tree)
    assert done.returncode != 0
    assert broken in done.stdout, done.stdout[-3000:]
