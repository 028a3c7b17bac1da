"""The commands that read (runs, report, the listings) load neither torch nor the runtime, and
records written by polyrhythm 0.1 are listed, reported and run again by this version."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from polyrhythm.config import make_config
from polyrhythm.metrics.records import STORE_NAME, config_fields
from polyrhythm.metrics.store import RunStore

FIXTURE = Path(__file__).parent / "fixtures" / "release-0.1" / "runs"
HEAVY = ("torch", "polyrhythm.runtime", "polyrhythm.launch", "polyrhythm.comm",
         "polyrhythm.api")

PROBE = f"""
import sys
from polyrhythm.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.startswith({HEAVY!r}))
print(code, heavy)
"""


def probe(*args: str) -> tuple[int, list[str], str]:
    """Run a command in a fresh interpreter; (exit code, heavy modules loaded, output)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *output, last = done.stdout.strip().splitlines()
    code, heavy = last.split(" ", 1)
    return int(code), eval(heavy), "\n".join(output)  # a list of names printed by repr


def store_with_runs(out: Path, count: int) -> list[str]:
    """A store of `count` completed runs (headline figures, two epochs each)."""
    store = RunStore(out / STORE_NAME)
    config = make_config({"workers": 2, "out": str(out)})
    ids = []
    for i in range(count):
        run_id = f"20260101-00{i:04d}-bsp-{i:06x}"
        store.add_run(run_id, f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
                      config.columns(), config.to_toml())
        epochs = [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_loss": 1.0,
                   "val_accuracy": 0.5 + e / 10, "samples_per_s": 100.0, "wall_s": e + 1.0}
                  for e in range(2)]
        store.complete_run(run_id, {"final_val_accuracy": 0.6, "samples_per_s": 100.0,
                                    "wall_s": 2.0}, epochs)
        ids.append(run_id)
    return ids


def test_reading_commands_load_neither_torch_nor_the_runtime(tmp_path):
    ids = store_with_runs(tmp_path, 50)
    code, heavy, output = probe("runs", "--out", str(tmp_path))
    assert code == 0 and heavy == []
    assert len(output.splitlines()) == 1 + 50 and ids[-1] in output
    for listing in ("strategies", "datasets", "models", "compressors"):
        code, heavy, output = probe(listing)
        assert code == 0 and heavy == [] and output
    code, heavy, output = probe("report", "--out", str(tmp_path), *ids[:3])
    assert code == 0 and heavy == [] and output.endswith("report.html")


def fixture_copy(tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    shutil.copytree(FIXTURE, out)
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polyrhythm.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_a_store_written_by_release_0_1_is_listed_and_reported(tmp_path):
    out = fixture_copy(tmp_path)
    listing = cli("runs", "--out", str(out))
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()[1:]]
    assert [(r[1], r[2]) for r in rows] == [
        ("completed", "bsp"), ("completed", "kbsp"), ("completed", "ssp"),
        ("completed", "localsgd"), ("completed", "easgd"), ("completed", "asp"),
        ("failed", "gossip")]
    report = cli("report", "--out", str(out), "--sweep", "release-0-1", "--format", "md")
    assert report.returncode == 0, report.stderr
    text = Path(report.stdout.strip()).read_text()
    for label in ("bsp", "kbsp", "ssp", "localsgd", "easgd"):
        assert f"| {label}" in text
    # Their stored configs read as flat fields, as this version's sectioned ones do.
    ssp = next(r for r in RunStore(out / STORE_NAME).runs() if r["strategy"] == "ssp")
    assert config_fields(ssp["config"])["staleness"] == 2


@pytest.mark.parametrize("run", ["20261123-162941-ssp-3d28ea", "20261123-163012-asp-d1aff9"])
def test_a_config_written_by_release_0_1_runs_again(tmp_path, run):
    out = fixture_copy(tmp_path)
    old = tomllib.loads((out / run / "config.toml").read_text())
    done = cli("train", "--config", str(out / run / "config.toml"), "--out", str(out),
               "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["strategy"] == old["strategy"]
    assert (summary["workers"], summary["epochs"]) == (old["workers"], old["epochs"])
    again = tomllib.loads(Path(summary["run_dir"], "config.toml").read_text())
    # The same run, now written in sections: every field the old file set has its value.
    fields = config_fields(Path(summary["run_dir"], "config.toml").read_text())
    read = {k: v for k, v in old.items() if k != "out"
            and not (k.startswith("synthetic_") and old["dataset"] != "synthetic")}
    assert {k: fields.get(k) for k in read} == read
    assert again["strategy"]["name"] == old["strategy"]
    assert len(RunStore(out / STORE_NAME).runs()) == 8
