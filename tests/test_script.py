"""A user's own training script as a polyrhythm job (runtime/script.py, launch/script.py):
what it trains equals what DDP and one process train, and each misuse is one line."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import HANG_GUARD_S
from polyrhythm import api
from polyrhythm.errors import ConfigError, RunFailed
from polyrhythm.metrics.records import RunRecord
from polyrhythm.runtime.script_data import ShardSampler

SCRIPT = Path(__file__).parent / "scripts" / "user_loop.py"
_spec = importlib.util.spec_from_file_location("user_loop", SCRIPT)
user_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(user_loop)
EPOCHS = 4  # 5 steps an epoch with 2 workers: 20 steps


def one_process(workers: int, optimizer: str = "adamw") -> dict[str, torch.Tensor]:
    """The script's model trained in this process on each step's union batch (every
    worker's batch of that step, which are the same size: the mean of their losses)."""
    model, opt, sched = user_loop.build(optimizer)
    data = user_loop.data()
    samplers = [ShardSampler(len(data), w, workers, seed=0) for w in range(workers)]
    for _ in range(EPOCHS):
        orders = [list(s) for s in samplers]
        for step in range(len(orders[0]) // user_loop.BATCH):
            losses = []
            for order in orders:
                x, y = data[order[step * user_loop.BATCH:(step + 1) * user_loop.BATCH]]
                losses.append(F.mse_loss(model(x), y))
            (sum(losses) / workers).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    return model.state_dict()


def farthest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run(tmp_path: Path, *script_args: str, **config) -> dict:
    return api.run_script(SCRIPT, list(script_args), {"out": str(tmp_path / "runs"), "seed": 0,
                                                       **config})


def in_group(command: list[str], cwd: Path, env: dict) -> None:
    """Run a command in a process group of its own; if it fails or hangs (HANG_GUARD_S),
    none of its processes (torchrun's ranks) outlives it."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, output.decode(errors="replace")[-2000:]


@pytest.mark.parametrize("epochs", [[], ["--plain-epochs"]])
def test_bsp_with_two_servers_and_adamw_groups_gives_one_process(tmp_path: Path,
                                                                epochs: list[str]) -> None:
    """AdamW with weight decay on the weights only, a cosine schedule: the servers step the
    script's optimizer on their slices at the rate each push carries. Epochs counted by
    job.epochs or, in a plain range, by each pass of the loader: the same."""
    summary = run(tmp_path, *epochs, strategy="bsp", servers=2, workers=2)
    model = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert farthest(model, one_process(workers=2)) <= 1e-5
    assert summary["epochs"] == EPOCHS and summary["weight_updates"] == 5 * EPOCHS
    # What the script logged is stored with each epoch; the last is the final figure.
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    assert summary["final_val_loss"] == losses[-1] and losses[-1] < losses[0]


def test_allreduce_from_a_script_gives_ddps_parameters(tmp_path: Path) -> None:
    """The same script under torchrun: polyrhythm's allreduce (strategy from the
    environment) against torch's DistributedDataParallel, SGD with momentum."""
    saved = {}
    for name, extra, env in (("ddp", ["--ddp"], {}),
                             ("polyrhythm", [], {"POLYRHYTHM_STRATEGY": "allreduce"})):
        saved[name] = tmp_path / f"{name}.pt"
        in_group([sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", "2", str(SCRIPT), "--optimizer", "sgd", "--save",
                  str(saved[name]), *extra], cwd=tmp_path, env={**os.environ, **env})
    assert farthest(torch.load(saved["ddp"]), torch.load(saved["polyrhythm"])) <= 1e-5


def test_plain_python_runs_the_script_alone(tmp_path: Path) -> None:
    """No launcher: one worker, nothing exchanged, nothing recorded."""
    in_group([sys.executable, str(SCRIPT), "--save", str(tmp_path / "alone.pt")],
             cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert farthest(torch.load(tmp_path / "alone.pt"), one_process(workers=1)) <= 1e-6
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("fault", "config", "says"), [
    ("wrap-twice", {}, "rank 1 (worker 0) failed: ConfigError: job.wrap was called twice"),
    ("unwrapped", {}, "an optimizer (SGD) was stepped without job.wrap"),
    ("seed", {}, "worker 1's initial parameters differ from worker 0's"),
    ("raise", {}, "rank 2 (worker 1) raised ValueError: the user's own bug (user_loop.py, "
                  "line"),
])
def test_misuse_is_one_line_naming_the_worker(tmp_path: Path, fault: str, config: dict,
                                              says: str) -> None:
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, "--fault", fault, strategy="asp", servers=1, workers=2, **config)
    assert says in str(failed.value) and "\n" not in str(failed.value)
    left = subprocess.run(["pgrep", "-f", str(SCRIPT)], capture_output=True, text=True)
    assert left.stdout == ""


def test_a_strategy_scripts_cannot_run_yet_is_one_line_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="switch does not run from a script yet"):
        run(tmp_path, strategy="switch", workers=2)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("2*"))


def test_non_elementwise_optimizer_runs_whole_on_workers_refused_on_servers(
        tmp_path: Path) -> None:
    summary = run(tmp_path, "--optimizer", "adafactor", strategy="allreduce", workers=2)
    assert summary["status"] == "completed"
    with pytest.raises(RunFailed, match="Adafactor is not an elementwise optimizer"):
        run(tmp_path, "--optimizer", "adafactor", strategy="bsp", servers=1, workers=2)
