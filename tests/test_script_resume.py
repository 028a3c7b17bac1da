"""`polyrhythm run --resume`: a user's script run that failed part-way, resumed, ends with the
model an uninterrupted run ends with, bit for bit (the script's optimizer state, its kept
schedule and tally, the servers' slices, re-sliced too); misuse is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polyrhythm import api
from polyrhythm.cli import main
from polyrhythm.config import make_config
from polyrhythm.errors import ConfigError, RunFailed
from polyrhythm.launch.launchers.script_launcher import ScriptCall
from polyrhythm.metrics.records import RunRecord, fail_run, start_run
from polyrhythm.metrics.store import RunStore

SCRIPT = Path(__file__).parent / "scripts" / "user_loop.py"
EPOCHS, STEPS = 4, 5  # user_loop's, with 2 workers
JOBS = {"bsp": {"strategy": "bsp", "servers": 1, "workers": 2},
        "allreduce": {"strategy": "allreduce", "workers": 2}}


def _run(out: Path, tally: Path, job: str, *more: str) -> dict:
    """user_loop (AdamW over two param groups, a cosine schedule) under `job`, keeping its
    schedule and a tally of its steps in the checkpoints."""
    return api.run_script(SCRIPT, ["--keep", str(tally), *more],
                          {"out": str(out), "seed": 0, **JOBS[job]})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """Per job, made once: an uninterrupted run's summary and final model."""
    made: dict[str, tuple[dict, dict]] = {}

    def get(job: str) -> tuple[dict, dict]:
        if job not in made:
            folder = tmp_path_factory.mktemp(job)
            summary = _run(folder / "runs", folder / "tally", job)
            assert (folder / "tally").read_text() == str(EPOCHS * STEPS)
            made[job] = summary, torch.load(Path(summary["run_dir"]) / "model.pt")
        return made[job]
    return get


@pytest.mark.parametrize(("job", "changes"), [
    ("bsp", {}),
    ("bsp", {"servers": 2}),  # the servers' slices and AdamW state, re-sliced
    ("allreduce", {}),  # the workers' own AdamW state
])
def test_a_failed_script_run_resumed_ends_with_the_uninterrupted_runs_model(
        tmp_path, monkeypatch, uninterrupted, job, changes):
    """Started in one folder with paths relative to it (the runs, the script's arguments),
    resumed from another: the script runs again where it ran."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunFailed) as failed:
        _run(Path("runs"), Path("tally"), job, "--fail-once", "failed-once")
    run_id = failed.value.run_id
    assert "RuntimeError: failing once, as asked (user_loop.py, line" in str(failed.value)
    assert str(failed.value).endswith(f"`polyrhythm run --resume {run_id} --out runs` goes on "
                                      "after epoch 2")
    out, tally = tmp_path / "runs", tmp_path / "tally"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    said = []
    summary = api.resume_script(run_id, out, say=said.append, **changes)
    assert said == [f"resuming run {run_id} after epoch 2"]
    assert summary["run_id"] == run_id and summary["status"] == "completed"
    assert summary["servers"] == changes.get("servers", JOBS[job].get("servers", 0))
    whole, model = uninterrupted(job)
    resumed = torch.load(RunRecord(out, run_id).model_path)
    assert resumed.keys() == model.keys()
    assert all(torch.equal(resumed[k], model[k]) for k in model), job
    # The kept tally came back: it counts the steps before the failure too.
    assert tally.read_text() == str(EPOCHS * STEPS)
    # Every epoch is in the record: those of the checkpoint, then the resumed ones.
    assert [e["val_loss"] for e in summary["epoch_metrics"]] == [
        e["val_loss"] for e in whole["epoch_metrics"]]
    assert len(RunStore(out / "polyrhythm.db").epochs(run_id)) == EPOCHS
    assert summary["weight_updates"] == whole["weight_updates"]


def test_a_script_that_loops_without_job_epochs_is_not_resumed_but_says_why(tmp_path):
    """Its epochs are its own loop's, which would start again from the first: every
    worker refuses at its first step, and the run stays failed, to be resumed again."""
    out = tmp_path / "runs"
    with pytest.raises(RunFailed) as failed:
        _run(out, tmp_path / "tally", "allreduce", "--plain-epochs", "--fail-once",
             str(tmp_path / "failed-once"))
    run_id = failed.value.run_id
    with pytest.raises(RunFailed) as refused:
        api.resume_script(run_id, out, say=lambda line: None)
    assert ("failed: ConfigError: a resumed script run goes on from job.epochs(n): this script "
            "steps before calling it (or loops without it), so it cannot be resumed "
            "(user_loop.py, line") in str(refused.value)
    assert RunStore(out / "polyrhythm.db").run(run_id)["status"] == "failed"


def _script_run(out: Path, script: Path) -> str:
    """A failed run recorded as `polyrhythm run` records one of `script` (no process
    started); its id."""
    record = start_run(make_config({"out": str(out), "strategy": "bsp", "workers": 2}),
                       script=str(script))
    ScriptCall.here(script, ["--epochs", "2"]).remember(record.dir)
    fail_run(record, "failed: for the test")
    return record.run_id


def _says(capsys, *argv: str) -> str:
    """The CLI's one line of error for `argv` (exit code 2)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("polyrhythm: error: "), err
    return err.removeprefix("polyrhythm: error: ").rstrip("\n")


def test_misuse_of_resume_is_one_line_and_leaves_the_run_as_it_was(tmp_path, capsys):
    out = tmp_path / "runs"
    gone = tmp_path / "train.py"
    gone.write_text("")
    run_id = _script_run(out, gone)
    gone.unlink()
    assert _says(capsys, "run", "--resume", run_id, "--out", str(out)) == (
        f"run {run_id}'s script {str(gone)!r} is not there any more: put it back to resume "
        "the run")
    assert _says(capsys, "train", "--resume", run_id, "--out", str(out)) == (
        f"run {run_id} is a script run (train.py): resume it with `polyrhythm run --resume "
        f"{run_id}`")
    assert _says(capsys, "run", "--resume", run_id, "--out", str(out), str(SCRIPT)) == (
        "--resume starts the run's own script with its own arguments: drop SCRIPT and what "
        "follows it")
    gone.write_text("")
    assert _says(capsys, "run", "--resume", run_id, "--out", str(out), "--epochs", "5") == (
        "a resumed run keeps its config: epochs cannot change (only checkpoint_every, "
        "servers can)")
    built_in = start_run(make_config({"out": str(out), "strategy": "bsp", "workers": 2}))
    fail_run(built_in, "failed: for the test")
    assert _says(capsys, "run", "--resume", built_in.run_id, "--out", str(out)) == (
        f"run {built_in.run_id} is not a script run: resume it with `polyrhythm train "
        f"--resume {built_in.run_id}`")
    assert _says(capsys, "run", "--out", str(out)) == (
        "polyrhythm run needs SCRIPT (or --resume RUN_ID)")
    store = RunStore(out / "polyrhythm.db")
    assert {store.run(r)["status"] for r in (run_id, built_in.run_id)} == {"failed"}


def test_a_kept_name_the_checkpoint_uses_is_refused():
    from polyrhythm.runtime.worker.script import Job

    with pytest.raises(ConfigError, match="job.keep cannot take the name 'model'"):
        Job(None).keep("model", torch.nn.Linear(1, 1))
