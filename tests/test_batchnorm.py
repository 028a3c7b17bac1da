"""BatchNorm's running statistics: each worker keeps its own while training; the model
validated and stored carries their batch-weighted mean, and is evaluated in eval mode."""

from __future__ import annotations

import torch

import polyrhythm
from helpers import equivalence_config, flat, max_diff, reference_parameters, stored_parameters
from polyrhythm.flat import RunningStatistics
from polyrhythm.models.build import build_model
from polyrhythm.runtime.job import whole_data
from polyrhythm.runtime.validation import evaluate


def test_bsp_stores_the_workers_batch_weighted_mean_statistics(tmp_path):
    # 3 workers split the batch of 64 as 22 + 21 + 21: the mean is weighted, not plain.
    config = equivalence_config(tmp_path, strategy="bsp", workers=3, model="resnet20",
                                dataset="digits", epochs=1, steps_per_epoch=6)
    summary = polyrhythm.train(config)
    own: list[torch.Tensor] = []
    reference = reference_parameters(config, own_statistics=own)
    stored = stored_parameters(summary)
    # Parameters and statistics as the one-process reference, whose statistics are the
    # weighted mean of its three workers' own.
    assert max_diff(stored, reference) <= 1e-4
    state = torch.load(f"{summary['run_dir']}/model.pt", weights_only=True)
    model = build_model("resnet20", (1, 8, 8), 10, seed=0)
    model.load_state_dict(state)
    statistics = RunningStatistics(model).get()
    weighted = (22 * own[0] + 21 * own[1] + 21 * own[2]) / 64
    assert max_diff(statistics, weighted) <= 1e-4
    # ...and not any one worker's, nor the initial ones, nor the plain mean.
    initial = RunningStatistics(build_model("resnet20", (1, 8, 8), 10, seed=0)).get()
    for other in (*own, initial, sum(own) / 3):
        assert max_diff(statistics, other) > 1e-3
    counters = [v for k, v in state.items() if k.endswith("num_batches_tracked")]
    assert counters and all(c == 6 for c in counters)  # every worker's steps


def test_the_stored_model_in_eval_mode_reproduces_the_final_accuracy(tmp_path):
    config = equivalence_config(tmp_path, strategy="asp", workers=2, model="resnet20",
                                dataset="digits", epochs=2, steps_per_epoch=8)
    summary = polyrhythm.train(config)
    model = build_model("resnet20", (1, 8, 8), 10, seed=0)
    model.load_state_dict(torch.load(f"{summary['run_dir']}/model.pt", weights_only=True))
    model.train()  # evaluate switches to eval mode itself, and back
    _, _, val = whole_data(config)
    got = evaluate(model, val)
    assert got["val_accuracy"] == summary["final_val_accuracy"]
    assert abs(got["val_loss"] - summary["final_val_loss"]) < 1e-6
    assert model.training


def test_flat_state_holds_the_buffers(tmp_path):
    model = build_model("resnet20", (3, 32, 32), 10, seed=0)
    statistics = RunningStatistics(model)
    values = statistics.get()
    assert len(values) == sum(b.numel() for b in model.buffers())
    statistics.set(values + 1)
    assert torch.equal(RunningStatistics(model).get(), values + 1)
    assert len(flat(model.state_dict())) == len(values) + sum(
        p.numel() for p in model.parameters())
