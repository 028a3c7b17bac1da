"""The epoch-end models a worker validates after training (runtime/snapshots.py): however
many epochs, in a run with or without a run folder and resumed, a worker holds at most two
models' worth more than it holds to train, and the figures are those of each epoch's model,
or of the workers' weighted mean of it, recomputed here from what each worker held at each
epoch end. The store gives back each epoch's bits, from a spill or the checkpoint's files."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch

from helpers import play_ranks
from polyrhythm.config import make_config
from polyrhythm.errors import DataError
from polyrhythm.flat import FlatParameters
from polyrhythm.models.build import build_model
from polyrhythm.runtime.checkpoint import Resume, complete_epochs, epoch_dir, snapshot_file
from polyrhythm.runtime.job import whole_data
from polyrhythm.runtime.snapshots import EpochSnapshots
from polyrhythm.runtime.validation import evaluate

EPOCHS, WORKERS = 6, 2
# The resumed run's checkpoints: every 2 epochs, the last two kept (after epochs 4 and 6);
# it resumes from the older.
CHECKPOINT_EVERY, RESUMED_AFTER = 2, 4
# Beyond what a worker holds to train: the model being validated and the final model put
# aside meanwhile. The old way held every epoch's model (6 here) and, agreeing on them, a
# stacked copy (6 more).
EXTRA_MODELS = 2


def models_held(model_bytes: int) -> float:
    """How many models' worth of tensor memory Python objects hold in this process, once it
    has settled: Gloo's worker thread lets go of a collective's tensors a moment after the
    collective returns (measured: an all-reduce worker's epoch end once held 4 models' worth
    for 3), so the count is read until two readings in a row agree (at most 50, 10 ms
    apart). Memory a leak holds stays, and is counted."""
    last = _models_held_now(model_bytes)
    for _ in range(50):
        time.sleep(0.01)
        now = _models_held_now(model_bytes)
        if now == last:
            return now
        last = now
    return last


def _models_held_now(model_bytes: int) -> float:
    """How many models' worth of tensor memory Python objects hold in this process now: the
    distinct storages of at least a model's size, whoever holds them (garbage collected
    first, so only what is held counts; the engine's frozen objects are unfrozen for it, as
    gc.get_objects does not see the permanent generation)."""
    gc.unfreeze()
    gc.collect()
    sizes = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor) and o.layout == torch.strided:
            storage = o.untyped_storage()
            if storage.nbytes() >= model_bytes:
                sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values()) / model_bytes


def _instrument(role, held: list, keep_as: str | None) -> None:
    """Measure models_held at each epoch end ("epoch") and, once reporting, at each
    all-reduce and validation batch ("report"); with `keep_as`, save each epoch end's model
    and consensus weight to a file named after it (not in memory: it would count)."""
    size, worker = role.flat.data.nbytes, role.ctx.worker_index
    validation = role.job.validation
    keep = validation.keep  # called as each epoch ends, its record done

    def epoch_measured(epoch: int) -> None:
        keep(epoch)
        if keep_as:
            torch.save({"flat": role.flat.data, "weight": role.strategy.consensus_weight()},
                       f"{keep_as}-worker-{worker}-epoch-{epoch}.pt")
        held.append(("epoch", models_held(size)))

    validation.keep = epoch_measured
    all_reduce, reporting = role.ctx.transport.all_reduce, []

    def all_reduce_measured(tensor, *args, **kwargs):
        if reporting:
            held.append(("report", models_held(size)))
        return all_reduce(tensor, *args, **kwargs)

    role.ctx.transport.all_reduce = all_reduce_measured
    role.model.register_forward_pre_hook(
        lambda module, args: held.append(("report", models_held(size))) if reporting else None)
    role.report_started = reporting.append  # call it before report()


def _trained(role, build) -> dict:
    """The whole run, then the report; every measure taken, and the epochs' records."""
    held = []
    _instrument(role, held, keep_as=str(Path(role.ctx.config.out) / "kept"))
    role.run()
    role.report_started(True)
    report = role.report(set())
    held.append(("after", models_held(role.flat.data.nbytes)))
    return {"epochs": report["epochs"], "held": held}


def _resumed(role, build) -> dict:
    """The whole run with checkpoints every CHECKPOINT_EVERY epochs (each epoch's model kept
    as it ends), left without a report; then a fresh worker resumed from the checkpoint after
    epoch RESUMED_AFTER trains the last epochs again and reports. Measures: the fresh
    worker's, before and after it resumed, and as in _trained."""
    run = Path(role.ctx.config.out) / "run"
    role.ctx.run_dir = run  # build() makes workers on this context
    first = build()
    _instrument(first, [], keep_as=str(Path(role.ctx.config.out) / "kept"))
    first.run()
    role.ctx.transport.barrier()  # every worker's files are written
    written = sorted(p.name for p in snapshot_file(run, 0, 0).parent.iterdir())
    done = complete_epochs(run, WORKERS, 0)
    del first
    resumed = build()
    size, held = resumed.flat.data.nbytes, []
    before = models_held(size)
    resumed.resume(Resume(epoch_dir(run, RESUMED_AFTER), servers=0))
    held.append(("resumed", models_held(size)))
    _instrument(resumed, held, keep_as=None)
    resumed.run()
    resumed.report_started(True)
    report = resumed.report(set())
    return {"epochs": report["epochs"], "held": held, "before": before, "written": written,
            "done": done}


def config_for(tmp_path: Path, strategy: str, **fields):
    return make_config({"strategy": strategy, "workers": WORKERS, "epochs": EPOCHS,
                        "dataset": "digits", "model": "mlp", "steps_per_epoch": 3,
                        "batch_size": 33, "out": str(tmp_path), **fields})


def reference_figures(config, kept: str, consensus: bool) -> list[dict]:
    """Each epoch's validation figures the old way: worker 0's model at the epoch's end, or
    the workers' models times their weights, added (two terms: in either order the same
    bits, as the all-reduce's) and divided by the weights' float64 sum as float32; validated
    with one thread, as the workers did."""
    _, train, val = whole_data(config)
    model = build_model(config.model, train.shape, train.classes, config.seed)
    flat = FlatParameters(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        figures = []
        for e in range(config.epochs):
            saved = [torch.load(f"{kept}-worker-{w}-epoch-{e}.pt", weights_only=True)
                     for w in range(WORKERS)]
            if consensus:
                (a, wa), (b, wb) = ((s["flat"], s["weight"]) for s in saved)
                total = torch.tensor(wa + wb, dtype=torch.float64).float()
                flat.data.copy_((a * wa + b * wb).div_(total))
            else:
                flat.data.copy_(saved[0]["flat"])
            figures.append(evaluate(model, val))
        return figures
    finally:
        torch.set_num_threads(threads)


def check_bounded(held: list, base: float, steady: bool = True) -> None:
    """The report holds at most EXTRA_MODELS more than `base`; where the strategy's own
    memory is `steady`, every epoch end holds `base` exactly, nothing more per epoch."""
    ends = [n for when, n in held if when == "epoch"]
    assert ends and (not steady or all(n == base for n in ends)), held
    reporting = [n for when, n in held if when != "epoch"]
    assert reporting and max(reporting) <= base + EXTRA_MODELS, (base, held)


def validated(epochs: list[dict]) -> list[dict]:
    return [{k: r[k] for k in ("val_loss", "val_accuracy")} for r in epochs]


@pytest.mark.parametrize(("strategy", "consensus"), [
    ("localsgd", True),
    ("gossip", True),  # weights off 1 at epoch ends: the division counts
    ("allreduce", False),  # worker 0's models alone
])
def test_memory_for_the_epochs_models_does_not_grow_and_figures_are_as_before(
        tmp_path, strategy, consensus):
    # No run folder (an in-process job): the models spill to a temporary file.
    config = config_for(tmp_path, strategy)
    got = play_ranks(tmp_path, config, _trained)
    assert [role for role, _ in got.values()] == ["worker"] * WORKERS
    for _, result in got.values():
        ends = [n for when, n in result["held"] if when == "epoch"]
        if strategy == "gossip":
            # Gossip's own memory varies: the models that arrived and await merging (all
            # merged before the report). The least an epoch end held is the bound's base.
            check_bounded(result["held"], base=min(ends), steady=False)
        else:
            check_bounded(result["held"], base=ends[0])
    first = got[0][1]
    assert validated(first["epochs"]) == reference_figures(config, str(tmp_path / "kept"),
                                                           consensus)


def test_a_resumed_worker_reads_the_epochs_models_when_validating_not_before(tmp_path):
    config = config_for(tmp_path, "localsgd", checkpoint_every=CHECKPOINT_EVERY)
    got = play_ranks(tmp_path, config, _resumed)
    first = got[0][1]
    # Each epoch's model went to its checkpoint file as the epoch ended, every worker's,
    # with its digest.
    assert first["written"] == sorted(f"worker-{w}-epoch-{e:04d}.pt{digest}"
                                      for w in range(WORKERS) for e in range(EPOCHS)
                                      for digest in ("", ".sha256"))
    assert first["done"] == [RESUMED_AFTER, EPOCHS]
    for _, result in got.values():
        (when, resumed), *held = result["held"]
        assert when == "resumed" and resumed == result["before"]  # nothing read yet
        check_bounded(held, base=result["before"])
    # The first 4 epochs validated on the files, the last 2 trained again: the figures of
    # the whole run's models (local SGD resumes exactly).
    assert validated(first["epochs"]) == reference_figures(config, str(tmp_path / "kept"),
                                                           consensus=True)


def odd_models(count: int, size: int = 1000) -> list[torch.Tensor]:
    """Flat models whose bits a lossy round trip would change: NaN, signed zeros, infinities,
    subnormals and ordinary values."""
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-45,
                            -1e-40])
    g = torch.Generator().manual_seed(0)
    return [torch.cat([special * (k + 1), torch.randn(size, generator=g)]) for k in
            range(count)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_spill_gives_each_epoch_its_bits_back_and_names_nothing_on_disk(tmp_path):
    models = odd_models(4)
    spill = EpochSnapshots(spill_dir=tmp_path)
    for e, model in enumerate(models):
        spill.put(e, model * 1)  # a temporary, as a worker's is
    assert list(tmp_path.iterdir()) == []  # unlinked from the start: nothing to leave
    assert len(spill) == 4
    for e in (2, 0, 3, 1):  # in any order, each as it was
        assert same_bits(spill.get(e), models[e])
    with pytest.raises(RuntimeError, match="snapshot of epoch 5 after 4 epochs"):
        spill.put(5, models[0])
    spill.close()


def test_checkpoint_files_hold_each_epoch_and_a_resume_finds_them_or_says_which_is_gone(
        tmp_path):
    models = odd_models(3)
    filed = EpochSnapshots(lambda e: snapshot_file(tmp_path, 1, e))
    for e, model in enumerate(models):
        filed.put(e, model)
    assert sorted(p.name for p in snapshot_file(tmp_path, 1, 0).parent.iterdir()) == [
        f"worker-1-epoch-{e:04d}.pt{digest}" for e in range(3) for digest in ("", ".sha256")]
    resumed = EpochSnapshots()  # a standby: it spills the epochs it trains itself
    resumed.adopt([snapshot_file(tmp_path, 1, e) for e in range(3)])
    resumed.put(3, models[0] + 1)
    assert all(same_bits(resumed.get(e), models[e]) for e in range(3))
    assert same_bits(resumed.get(3), models[0] + 1)
    snapshot_file(tmp_path, 1, 1).unlink()
    with pytest.raises(DataError, match="lacks epoch 2's model snapshot .*worker-1-epoch-0001"):
        EpochSnapshots().adopt([snapshot_file(tmp_path, 1, e) for e in range(3)])
