"""A user's own training script as a polyrhythm job (runtime/worker/script.py,
launch/rank/script_rank.py): what it trains equals what DDP and one process train, and each
misuse is one line."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from helpers import HANG_GUARD_S
from polyrhythm import api
from polyrhythm.cli.train import format_summary
from polyrhythm.errors import PolyrhythmError, RunFailed
from polyrhythm.launch.rank.forked import process_name
from polyrhythm.layout import BucketLayout
from polyrhythm.metrics.records import RunRecord
from polyrhythm.metrics.store import RunStore
from script_reference import (
    EPOCHS,
    SCRIPT,
    downpour_one_worker,
    farthest,
    one_process,
    user_loop,
)


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


def test_downpour_steps_a_scripts_replica_at_each_groups_rate_between_fetches(
        tmp_path: Path) -> None:
    """Between fetches a Downpour worker steps its replica with plain SGD: a script's SGD
    over two groups (the biases at a fifth of the rate, both under a cosine schedule) at each
    group's rate, as one process running Downpour's arithmetic does."""
    summary = run(tmp_path, "--optimizer", "sgd-groups", strategy="downpour", workers=1,
                  servers=1, fetch_every=2)
    model = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert farthest(model, downpour_one_worker(fetch_every=2)) <= 1e-6


def test_downpour_between_fetches_refuses_a_scripts_optimizer_that_is_not_sgd(
        tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as refused:
        run(tmp_path, strategy="downpour", workers=1, servers=1, fetch_every=2)  # AdamW
    assert ("ConfigError: downpour with fetch_every > 1 steps each worker's replica with "
            "plain SGD between fetches (at each param group's lr), not AdamW: wrap a "
            "torch.optim.SGD, or fetch every step") in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("epochs", [[], ["--plain-epochs"]])
def test_bsp_with_two_servers_and_adamw_groups_gives_one_process(tmp_path: Path,
                                                                epochs: list[str]) -> None:
    """AdamW with weight decay on the weights only, a cosine schedule: the servers step the
    script's optimizer on their slices at the rate each push carries. Epochs counted by
    job.epochs or, in a plain range, by each pass of the loader: the same."""
    summary = run(tmp_path, *epochs, strategy="bsp", servers=2, workers=2)
    assert summary["final_val_accuracy"] is None  # it logs a loss, no accuracy
    record = RunRecord(tmp_path / "runs", summary["run_id"])
    assert farthest(torch.load(record.model_path), one_process(workers=2)) <= 1e-5
    # The store names the script, not the config's default data and model it never read.
    row = record.store.run(summary["run_id"])
    assert (row["dataset"], row["model"]) == ("script", SCRIPT.name)
    assert summary["epochs"] == EPOCHS and summary["weight_updates"] == 5 * EPOCHS
    # What the script logged is stored with each epoch; the final model was not evaluated
    # (no job.finish(evaluate=...)), so its figures are unknown, and what worker 0 logged
    # last is kept apart, named for what it is.
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    assert math.isnan(summary["final_val_loss"]) and not summary["final_evaluated"]
    assert summary["last_logged"] == {"val_loss": losses[-1], "worker": 0}
    assert losses[-1] < losses[0]


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
    # Rank 0 recorded the polyrhythm side (torchrun names no run) in ./runs.
    [row] = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    assert (row["strategy"], row["dataset"], row["model"]) == ("allreduce", "script",
                                                                SCRIPT.name)


def test_plain_python_runs_the_script_alone(tmp_path: Path) -> None:
    """No launcher: one worker, nothing exchanged, nothing recorded."""
    in_group([sys.executable, str(SCRIPT), "--save", str(tmp_path / "alone.pt")],
             cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert farthest(torch.load(tmp_path / "alone.pt"), one_process(workers=1)) <= 1e-6
    assert not (tmp_path / "runs").exists()


def test_a_scripts_buckets_leave_while_its_backward_runs(tmp_path: Path) -> None:
    """Under bsp with buckets of 4 KiB, the deep model's buckets that hold only its later
    layers are pushed, given job.backward(loss), before backward has computed the first
    layer's gradient, at every step (order of events: the messages sent by then); given
    loss.backward(), none before the step. Both train the same model, bit for bit."""
    first_layer = 8 * 64 + 64  # its weight and bias lead the flat model
    numel = sum(p.numel() for p in user_loop.build("sgd", deep=True)[0].parameters())
    later = sum(a >= first_layer for _, a, _ in BucketLayout(numel, 1, 4).buckets)
    assert later >= 3
    models, seen = [], {}
    for backward in ([], ["--plain-backward"]):
        probe = tmp_path / f"probe{len(backward)}"
        summary = run(tmp_path, "--deep", "--optimizer", "sgd", "--epochs", "2", "--probe",
                      str(probe), *backward, strategy="bsp", servers=1, workers=1, bucket_kb=4)
        seen[bool(backward)] = [int(n) for n in probe.read_text().split()]
        models.append(torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path))
    steps = 2 * user_loop.EXAMPLES // user_loop.BATCH
    assert seen == {False: [later] * steps, True: [0] * steps}
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])


@pytest.mark.parametrize(("fault", "says"), [
    ("clip-after-send", "ConfigError: the gradients changed between job.backward(loss) and "
                        "opt.step() (a clip? another backward?), after job.backward sent them"),
    ("backward-twice", "ConfigError: job.backward(loss) came twice before opt.step(): the "
                       "first sent the step's gradients"),
])
def test_gradients_changed_after_job_backward_sent_them_are_one_line(
        tmp_path: Path, fault: str, says: str) -> None:
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, "--fault", fault, strategy="bsp", servers=1, workers=1)
    assert says in str(failed.value) and "\n" not in str(failed.value)


@pytest.mark.parametrize(("fault", "config", "says"), [
    # Every worker wraps twice: whichever tells first is named.
    ("wrap-twice", {}, "(worker ?) failed: ConfigError: job.wrap was called twice"),
    ("unwrapped", {}, "an optimizer (SGD) was stepped without job.wrap"),
    ("seed", {}, "worker 1's initial parameters differ from worker 0's"),
    ("raise", {}, "rank 2 (worker 1) raised ValueError: the user's own bug (user_loop.py, "
                  "line"),
    ("counted-output", {"compute": "emulated", "compute_time": "10ms"},
     "ConfigError: emulated compute stands in for Counted's output with zeros of its shapes, "
     "so it takes tensors and tuples, lists or dicts of them, not the int at "
     "output['examples']: run this model with --compute real"),
    ("log-of-output", {"compute": "emulated", "compute_time": "10ms"},
     "ConfigError: under emulated compute the model's output is zeros and the script's loss "
     "on them is inf: emulated compute needs a loss that is finite on a zero output"),
])
def test_misuse_is_one_line_naming_the_worker(tmp_path: Path, fault: str, config: dict,
                                              says: str) -> None:
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, "--fault", fault, strategy="asp", servers=1, workers=2, **config)
    said = str(failed.value)
    if "(worker ?)" in says:  # any worker's rank (a server's would not match)
        said = re.sub(r"rank \d+ \(worker \d+\)", "(worker ?)", said)
    assert says in said and "\n" not in said
    if fault == "raise":  # the log the error names holds its traceback
        log = str(failed.value).split("traceback in ")[1].split(";")[0]
        assert "ValueError: the user's own bug" in Path(log).read_text()
    assert ranks_left() == []


def ranks_left() -> list[str]:
    """The ranks this test process started (forked from its forkserver, named polyrhythm-rN
    in ps) still alive; those of other tests, in another pytest-xdist worker, are not its."""
    left = []
    for process in psutil.Process().children(recursive=True):
        try:
            if (process.name().startswith(process_name(0)[:-1])
                    and process.status() != psutil.STATUS_ZOMBIE):
                left.append(f"{process.name()} (pid {process.pid})")
        except psutil.NoSuchProcess:  # ended while looked at
            continue
    return left


def test_a_worker_that_ends_itself_is_named_not_the_peers_it_left(tmp_path: Path) -> None:
    """Both workers catch the switch rule's refusal at their first step (one epoch: never
    all-reduce) and exit 3 on their own, without a report; the server sees the connection
    go before they have ended. The launcher names a worker, not the server's lost peer."""
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, "--fault", "exit", "--epochs", "1", strategy="switch", at=0.5,
            servers=1, workers=2)
    assert re.search(r"failed: rank [12] \(worker [01]\) failed: exit code 3$",
                     str(failed.value)), failed.value


def test_a_rank_killed_once_the_run_is_recorded_fails_nothing(tmp_path: Path) -> None:
    """Worker 1 SIGKILLs itself after job.finish(), when rank 0 has recorded the run: the
    run is completed, and its launcher says so (it does not report a failure that came
    after the results)."""
    summary = run(tmp_path, "--fault", "killed-after-finish", strategy="bsp", servers=1,
                  workers=2)
    assert summary["status"] == "completed"
    (row,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    assert row["status"] == "completed"


# 160 examples shared by 3 workers: 53 each, 4 batches of 16 an epoch, 16 steps in 4 epochs.
ASP_OF_THREE = {"strategy": "asp", "servers": 1, "workers": 3}


def test_an_asp_script_goes_on_without_a_killed_worker_and_records_it(tmp_path: Path,
                                                                       capsys) -> None:
    """Worker 2 SIGKILLs itself after 5 of its 16 steps (on_worker_failure = continue, asp's
    default): the others take all theirs and the run completes. Under asp each push is a
    weight update: the survivors' 16 each and the lost worker's 5."""
    summary = run(tmp_path, "--kill", "2", "5", **ASP_OF_THREE)
    assert summary["status"] == "completed" and summary["on_worker_failure"] == "continue"
    (lost,) = summary["lost_workers"]
    assert (lost["worker"], lost["rank"], lost["pushes"]) == (2, 3, 5) and lost["at_s"] > 0
    assert [(w["worker"], w["steps"]) for w in summary["per_worker"]] == [(0, 16), (1, 16)]
    assert summary["weight_updates"] == 16 + 16 + 5
    assert "polyrhythm: worker 2 lost: was killed by SIGKILL; the others go on" in (
        capsys.readouterr().out)
    # What polyrhythm run prints of the run, as polyrhythm train does.
    assert re.search(r"\n  worker 2 was lost at \d+\.\d s, having pushed 5 gradients; the "
                     "others carried on without it\n", format_summary(summary))
    assert ranks_left() == []


def test_an_allreduce_script_told_to_continue_sums_on_without_a_killed_worker(
        tmp_path: Path) -> None:
    """Worker 2 SIGKILLs itself after 5 of its 16 steps under allreduce told to continue: the
    other two sum on over themselves (comm/membership.py) and take all theirs; worker 2 took
    part in 5 sums of gradients (the check that every worker starts alike is bookkeeping,
    not one of them)."""
    summary = run(tmp_path, "--kill", "2", "5", strategy="allreduce", workers=3,
                  on_worker_failure="continue")
    (lost,) = summary["lost_workers"]
    assert (lost["worker"], lost["rank"], lost["pushes"]) == (2, 2, 5)
    assert [(w["worker"], w["steps"]) for w in summary["per_worker"]] == [(0, 16), (1, 16)]
    assert summary["membership"][0]["workers"] == 2
    # What polyrhythm run prints of it: the rounds it had with the others, not pushes.
    assert re.search(r"\n  worker 2 was lost at \d+\.\d s, after 5 rounds with the others; "
                     "the others carried on without it\n", format_summary(summary))
    assert ranks_left() == []


@pytest.mark.parametrize(("script_args", "config", "says"), [
    (["--kill", "2", "5"], {"strategy": "bsp"}, "rank 3 (worker 2) was killed by SIGKILL"),
    (["--kill", "2", "0"], {}, "rank 3 (worker 2) was killed by SIGKILL"),  # before training
    (["--fault", "raise"], {}, "rank 2 (worker 1) raised ValueError: the user's own bug "
                               "(user_loop.py, line"),
], ids=["bsp-aborts", "killed-before-its-first-step", "raised"])
def test_a_worker_that_is_no_loss_to_go_on_without_fails_the_script_naming_it(
        tmp_path: Path, script_args: list[str], config: dict, says: str) -> None:
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, *script_args, **{**ASP_OF_THREE, **config})
    assert f"failed: {says}" in str(failed.value) and "\n" not in str(failed.value)
    (row,) = RunStore(tmp_path / "runs" / "polyrhythm.db").runs()
    assert row["status"] == "failed" and says in row["error"]
    assert ranks_left() == []


# Strategy-Switch from the script: all-reduce for ⌊0.5 · 4⌋ = 2 of the script's 4 epochs
# (its job.epochs(4); the config's default 3 would switch after 1), then the servers'.
SWITCH = {"strategy": "switch", "at": 0.5, "workers": 2}


def phases(summary: dict) -> list[str]:
    return [e["phase"] for e in summary["epoch_metrics"]]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_switch_to_bsp_hands_the_scripts_optimizer_over_exactly(tmp_path: Path,
                                                               optimizer: str) -> None:
    """bsp is synchronous: the run is one process on the union batch only if the servers
    take over the script's optimizer whole: SGD's momentum buffers; AdamW's moments and
    step count, its two groups' weight decays and rates, at the cosine schedule's rate."""
    summary = run(tmp_path, "--optimizer", optimizer, to="bsp", servers=2, **SWITCH)
    assert summary["switch_epoch"] == 2 and phases(summary) == ["allreduce"] * 2 + ["bsp"] * 2
    assert summary["weight_updates"] == 5 * EPOCHS  # the servers' versions carry on from 10
    model = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert farthest(model, one_process(workers=2, optimizer=optimizer)) <= 1e-5
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    assert losses[3] < losses[1] < losses[0]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_switch_to_asp_trains_on_after_the_switch(tmp_path: Path, optimizer: str) -> None:
    summary = run(tmp_path, "--optimizer", optimizer, to="asp", servers=1, **SWITCH)
    assert summary["switch_epoch"] == 2 and phases(summary) == ["allreduce"] * 2 + ["asp"] * 2
    # Every push after the switch is an update of its own: 2 workers' 10 steps each.
    assert summary["weight_updates"] == 10 + 2 * 10
    # Asynchronous steps differ from run to run, and this small model levels off by the
    # switch (all-reduce's 4 epochs too): each epoch after it stays below the first
    # (validation 0.29 with SGD, 0.25 with AdamW; about 0.25 and 0.235 after the switch).
    for metric in ("val_loss", "train_loss"):
        first, *_, third, fourth = (e[metric] for e in summary["epoch_metrics"])
        assert third < 0.97 * first and fourth < 0.97 * first


def test_the_loss_rule_reads_worker_0s_logged_loss_on_every_worker(tmp_path: Path) -> None:
    """Worker 1 logs a flat 1.0, which alone would fire the rule after epoch 2; worker 0's
    loss (AdamW's, changing 4.2 % then 3.2 %) fires it after epoch 3, on both workers (a
    worker switching alone would leave the other waiting until the timeout)."""
    summary = run(tmp_path, "--fault", "uneven-val-loss", strategy="switch",
                  rule="empirical", window=1, loss_threshold=3.5, to="bsp", servers=1,
                  workers=2, timeout=60)
    assert summary["switch_epoch"] == 3 and phases(summary) == ["allreduce"] * 3 + ["bsp"]


def test_a_loss_rule_without_a_logged_val_loss_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as failed:
        run(tmp_path, "--fault", "no-val-loss", strategy="switch", rule="empirical",
            to="asp", servers=1, workers=2)
    message = str(failed.value)
    assert "\n" not in message and ("ConfigError: switch's rule empirical reads each "
                                    "epoch's validation loss, and epoch 1 has none: log it "
                                    "with job.log(val_loss=...) every epoch") in message


def test_non_elementwise_optimizer_runs_whole_on_workers_refused_on_servers(
        tmp_path: Path) -> None:
    summary = run(tmp_path, "--optimizer", "adafactor", strategy="allreduce", workers=2)
    assert summary["status"] == "completed"
    with pytest.raises(RunFailed, match="Adafactor is not an elementwise optimizer"):
        run(tmp_path, "--optimizer", "adafactor", strategy="bsp", servers=1, workers=2)


# Emulated compute from a script: the wrapped model sleeps for each step's compute time and
# returns zeros of its output's shapes, so the script's loss runs on zeros and its backward
# leaves zero gradients of full size.

def initial_model() -> dict[str, torch.Tensor]:
    return user_loop.build("sgd")[0].state_dict()


def compute_spans(tmp_path: Path, run_id: str) -> dict[tuple[int, int], float]:
    """Each (worker, step)'s recorded compute seconds. A script's clock starts at its first
    step, after that step's forward and backward: step 0's span leaves them out."""
    rows = RunStore(tmp_path / "runs" / "polyrhythm.db").series("iterations", run_id)
    return {(r["worker"], r["step"]): r["compute_s"] for r in rows if r["step"] > 0}


BSP_JOB = {"strategy": "bsp", "servers": 1, "workers": 2}


@pytest.fixture(scope="module")
def real_bsp(tmp_path_factory) -> tuple[Path, dict]:
    """A real run of the script under bsp, SGD with momentum and no weight decay, made once
    for the module: (the folder its runs/ is in, its summary). Tests that change its store
    change a copy (copied)."""
    folder = tmp_path_factory.mktemp("real")
    return folder, run(folder, "--optimizer", "sgd", **BSP_JOB)


def copied(real_bsp: tuple[Path, dict], tmp_path: Path) -> Path:
    """The real run's runs/ folder copied into tmp_path (every process of the run has
    ended; SQLite rebuilds the store's shared-memory index when the copy is opened)."""
    shutil.copytree(real_bsp[0] / "runs", tmp_path / "runs",
                    ignore=shutil.ignore_patterns("*-shm"))
    return tmp_path / "runs"


def test_emulated_compute_replays_a_scripts_steps_with_its_full_traffic(tmp_path: Path,
                                                                         real_bsp) -> None:
    """bsp, SGD with momentum and no weight decay: the replay of a real run sleeps each of
    its compute times, sends every message the real run sent, byte for byte, and ends with
    the initial parameters (every gradient was zero). The script's own validation loss ran
    on the zero output: the targets' mean square; the training loss is unknown."""
    copied(real_bsp, tmp_path)  # the replay is stored beside the run it replays
    real = real_bsp[1]
    emulated = run(tmp_path, "--optimizer", "sgd", compute="emulated",
                   compute_from=real["run_id"], **BSP_JOB)
    for key in ("bytes_sent", "messages_sent"):
        assert ([r[key] for r in emulated["traffic_per_rank"]]
                == [r[key] for r in real["traffic_per_rank"]])
    measured, replayed = (compute_spans(tmp_path, r["run_id"]) for r in (real, emulated))
    assert replayed.keys() == measured.keys() and len(replayed) == 2 * (5 * EPOCHS - 1)
    assert all(replayed[k] >= measured[k] for k in measured)
    model = torch.load(RunRecord(tmp_path / "runs", emulated["run_id"]).model_path)
    assert farthest(model, initial_model()) == 0.0
    targets = user_loop.data().tensors[1]
    for epoch in emulated["epoch_metrics"]:
        assert math.isnan(epoch["train_loss"])
        assert epoch["val_loss"] == pytest.approx(float((targets ** 2).mean()), rel=1e-6)


def test_eight_emulated_workers_of_a_script_sleep_each_steps_compute_time(
        tmp_path: Path) -> None:
    """Nine processes on this machine's cores: 8 workers at 20 ms a step and one server.
    160 examples over 8 workers: 20 each, 2 steps an epoch of 16 and 4 examples."""
    summary = run(tmp_path, "--optimizer", "sgd", "--epochs", "2", strategy="bsp", servers=1,
                  workers=8, compute="emulated", compute_time="20ms")
    assert summary["status"] == "completed" and summary["weight_updates"] == 2 * 2
    spans = compute_spans(tmp_path, summary["run_id"])
    assert sorted(spans) == [(w, s) for w in range(8) for s in (1, 2, 3)]
    assert min(spans.values()) >= 0.020
    model = torch.load(RunRecord(tmp_path / "runs", summary["run_id"]).model_path)
    assert farthest(model, initial_model()) == 0.0


def test_replaying_an_unknown_run_is_one_line_before_a_run_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(PolyrhythmError, match="no run 'nope'"):
        run(tmp_path, compute="emulated", compute_from="nope", strategy="allreduce", workers=2)
    assert not list((tmp_path / "runs").glob("*/config.toml"))


def test_calibrating_a_script_run_takes_its_model_batch_and_measured_spans(
        tmp_path: Path, real_bsp) -> None:
    """The simulator calibrated from a script's run: the script's flat model, the global
    batch of its workers' loaders (not the config's), each worker's compute spans after
    the warm-up as the engine recorded them, the servers' update time; its prediction
    replays those spans and takes the script's batches."""
    from polyrhythm.config import load_config
    from polyrhythm.errors import StoreError
    from polyrhythm.sim.calibrate import calibrate
    from polyrhythm.sim.study import predict_runs

    summary = real_bsp[1]
    out, run_id = copied(real_bsp, tmp_path), summary["run_id"]
    cal = calibrate(out, run_id)
    model, _, _ = user_loop.build("sgd")
    assert cal.costs.parameters == sum(p.numel() for p in model.parameters()) == 161
    assert cal.config.batch_size == 2 * user_loop.BATCH != load_config().batch_size
    warmup, steps = summary["warmup_steps"], 5 * EPOCHS
    assert cal.iterations == steps
    rows = RunStore(out / "polyrhythm.db").series("iterations", run_id)
    spans = [[r["compute_s"] for r in sorted(rows, key=lambda r: r["step"])
              if r["worker"] == w and r["step"] >= warmup] for w in range(2)]
    assert [len(s) for s in spans] == [steps - warmup] * 2
    assert cal.costs.compute == spans  # no slowdown or CPU share to take out
    assert cal.costs.update_s == pytest.approx(sum(summary["update_s_per_server"]) / steps)
    pushed = sorted(r["push_s"] + r["pull_s"] for r in rows if r["step"] >= warmup)
    assert cal.costs.message_s == pytest.approx(pushed[len(pushed) // 2] / 2)
    (predicted,) = predict_runs([cal])
    assert predicted.measured == summary["samples_per_s"]
    assert predicted.result.weight_updates == summary["weight_updates"] == steps
    for log, measured in zip(predicted.result.logs, spans, strict=True):
        # The steps after the warm-up replay the measured ones, each once.
        assert log.compute_s == pytest.approx(sum(measured))
        assert log.samples == (steps - warmup) * user_loop.BATCH
        assert log.end - log.start >= log.compute_s
    RunStore(out / "polyrhythm.db").amend_summary(run_id, {**summary, "batch_size": 0})
    with pytest.raises(StoreError, match=f"run {run_id} recorded no batch size"):
        calibrate(out, run_id)


RUNS_OPTIMIZER = """
import sys
import torch
import polyrhythm
job = polyrhythm.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
job.wrap(model)  # no optimizer: the run's [optimizer] steps the model
x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
for epoch in job.epochs(2):
    for _ in range(5):
        model.zero_grad()
        job.backward(torch.nn.functional.cross_entropy(model(x), y))
        job.step()
job.finish()
job.save(sys.argv[1])
"""


def test_a_script_that_leaves_the_optimizer_to_the_run_trains_on_servers_as_alone(
        tmp_path: Path) -> None:
    """job.wrap(model) and job.step(): the run's [optimizer] steps the model, on the servers
    under bsp as on the one worker itself (their servers once failed on the optimizer the
    script did not give)."""
    script = tmp_path / "runs_optimizer.py"
    script.write_text(RUNS_OPTIMIZER)
    saved = {}
    for strategy, servers in (("bsp", 1), ("allreduce", 0)):
        saved[strategy] = tmp_path / f"{strategy}.pt"
        summary = api.run_script(script, [str(saved[strategy])],
                                 {"out": str(tmp_path / "runs"), "strategy": strategy,
                                  "workers": 1, "servers": servers, "lr": 0.1})
        assert summary["status"] == "completed" and summary["weight_updates"] == 10
    assert farthest(torch.load(saved["bsp"]), torch.load(saved["allreduce"])) <= 1e-6
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the script's initial model: training moved it
        initial = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                      torch.nn.Linear(8, 2)).state_dict()
    assert farthest(torch.load(saved["bsp"]), initial) > 1e-3
