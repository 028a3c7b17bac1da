"""The `loss` setting: cross_entropy (the default, today's numbers), mse and bce. Each loss's
arithmetic, targets and model check; the weighted worker gradients of each are the global
batch's; and mse and bce runs of two workers against the single-process reference."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import polyrhythm
from helpers import (
    equivalence_config,
    max_diff,
    reference_parameters,
    stored_parameters,
    worker_gradient,
)
from polyrhythm.cli.train import format_summary
from polyrhythm.config import make_config
from polyrhythm.config.declared import LOSS_NAMES
from polyrhythm.data.sharding import worker_batch_sizes
from polyrhythm.errors import ConfigError
from polyrhythm.losses import LOSSES
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.models.build import build_model, check_model
from polyrhythm.report import write_report
from polyrhythm.runtime.job import whole_data
from polyrhythm.runtime.validation import validation_record


def ten_outputs(shape: tuple[int, ...], classes: int) -> nn.Module:
    """A user's model that keeps 10 outputs whatever it is asked for."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 10))


def two_outputs(shape: tuple[int, ...], classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 2))


def write_table(path, task: str, rows: int = 400, seed: int = 0):
    """A CSV of 4 features and the target first: a noisy linear function (mse) or its sign
    (bce), as YearPredictionMSD and HIGGS are laid out."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)) * [1.0, 10.0, 0.1, 3.0] + [0.0, 50.0, 1.0, -2.0]
    z = (x - [0.0, 50.0, 1.0, -2.0]) / [1.0, 10.0, 0.1, 3.0] @ [1.5, -2.0, 0.5, 0.0]
    y = z + 0.3 * rng.normal(size=rows)
    target = y + 7.0 if task == "mse" else (y > 0).astype(float)
    path.write_text("".join(",".join(f"{v:.9g}" for v in (t, *f)) + "\n"
                            for t, f in zip(target, x, strict=True)))
    return path


def test_the_declared_names_are_the_implemented_losses():
    assert set(LOSS_NAMES) == set(LOSSES)
    assert make_config({}).loss == "cross_entropy"
    assert "loss" not in make_config({}).to_dict()  # a stored config reads as before
    assert make_config({"loss": "mse"}).to_dict()["loss"] == "mse"
    with pytest.raises(ConfigError, match="loss must be one of cross_entropy, mse, bce, got "
                                          "'hinge'"):
        make_config({"loss": "hinge"})


def test_each_loss_computes_its_formula():
    logits = torch.tensor([[2.0, -1.0], [0.5, 1.5], [-3.0, 0.0]])
    classes = torch.tensor([0, 0, 1])
    ce = LOSSES["cross_entropy"]
    assert torch.equal(ce(logits, classes), F.cross_entropy(logits, classes))  # bit for bit
    assert ce.correct(logits, classes) == 2
    out = torch.tensor([[1.0], [-2.0], [0.5]])
    values = torch.tensor([3.0, -2.0, 0.0])
    mse = LOSSES["mse"]
    assert mse(out, values).item() == pytest.approx((4 + 0 + 0.25) / 3)
    assert mse(out.view(-1), values, reduction="sum").item() == pytest.approx(4.25)
    labels = torch.tensor([1, 0, 0])
    bce = LOSSES["bce"]
    expected = -(math.log(1 / (1 + math.exp(-1))) + math.log(1 - 1 / (1 + math.exp(2)))
                 + math.log(1 - 1 / (1 + math.exp(-0.5)))) / 3
    assert bce(out, labels).item() == pytest.approx(expected, rel=1e-6)
    assert bce.correct(out, labels) == 2  # logit > 0 is class 1: right, right, wrong
    assert [LOSSES[n].outputs(7) for n in ("cross_entropy", "mse", "bce")] == [7, 1, 1]


def test_validation_records_accuracy_only_for_losses_that_classify():
    assert validation_record([6.0, 3], 4, LOSSES["bce"]) == {"val_loss": 1.5,
                                                            "val_accuracy": 0.75}
    assert validation_record([6.0], 4, LOSSES["mse"]) == {"val_loss": 1.5}


def test_targets_are_checked_and_converted():
    where = "dataset csv"
    whole = np.array([0.0, 2.0, 1.0])
    assert LOSSES["cross_entropy"].targets(whole, 3, where).dtype == np.int64
    ids = np.array([0, 1, 1])
    assert LOSSES["cross_entropy"].targets(ids, 2, where) is ids  # as they were
    assert LOSSES["bce"].targets(np.array([1.0, 0.0]), 2, where).tolist() == [1, 0]
    assert LOSSES["mse"].targets(np.array([1921, 2011]), 2012, where).dtype == np.float32
    with pytest.raises(ConfigError, match=r"dataset csv: loss cross_entropy needs class ids "
                                          r"0, 1, 2, .*; example 2 has target 0.5"):
        LOSSES["cross_entropy"].targets(np.array([1.0, 0.5]), 2, where)
    with pytest.raises(ConfigError, match="example 3 has target -1"):
        LOSSES["cross_entropy"].targets(np.array([1.0, 0.0, -1.0]), 2, where)
    with pytest.raises(ConfigError, match="loss bce needs two classes, 0 and 1; the data has "
                                          "10"):
        LOSSES["bce"].targets(np.arange(10), 10, "dataset mnist5k")
    with pytest.raises(ConfigError, match="loss bce needs targets 0 and 1; example 2 has "
                                          "target 0.5"):
        LOSSES["bce"].targets(np.array([1.0, 0.5]), 1, where)


def test_registered_models_get_the_outputs_their_loss_needs():
    for loss, outputs in (("cross_entropy", 2), ("mse", 1), ("bce", 1)):
        model = build_model("mlp", (4,), 2, 0, loss)
        assert model[-1].out_features == outputs, loss
        check_model("mlp", (4,), 2, loss)


def test_a_model_whose_output_does_not_fit_the_loss_is_refused_before_a_run(tmp_path):
    cases = [("mse", "test_losses:ten_outputs", "loss mse needs one output per sample; the "
              "model gives outputs of shape (10,)"),
             ("bce", "test_losses:two_outputs", "loss bce needs one output per sample; the "
              "model gives outputs of shape (2,)")]
    for loss, model, message in cases:
        data = write_table(tmp_path / f"{loss}.csv", loss)
        with pytest.raises(ConfigError, match=f"model {model}: {re.escape(message)}"):
            polyrhythm.train(dict(dataset="csv", data_path=str(data), loss=loss, model=model,
                                  out=str(tmp_path / "runs"), workers=2))
    with pytest.raises(ConfigError, match=r"loss cross_entropy needs a logit per class \(10\) "
                                          r"for each sample; the model gives outputs of shape "
                                          r"\(2,\)"):
        check_model("test_losses:two_outputs", (1, 8, 8), 10)
    assert not (tmp_path / "runs").exists()  # refused before any run was recorded


@pytest.mark.parametrize("loss", ["mse", "bce"])
def test_weighted_worker_gradients_are_the_global_gradient(tmp_path, loss):
    # As for cross-entropy (test_equivalence.py): in float64, sum_i (b_i/B) g_i of the
    # workers' mean losses is the gradient of the mean loss over the union of their batches.
    data = write_table(tmp_path / "table.csv", loss)
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data), loss=loss,
                                model="linear", workers=3, batch_size=64)  # registered
    _, train, _ = whole_data(config)
    model = build_model(config.model, train.shape, train.classes, 0, loss).double()
    x, y = train.batch(slice(0, 64))
    x = x.double()
    weighted = [torch.zeros_like(p) for p in model.parameters()]
    start = 0
    for size in worker_batch_sizes(64, 3):
        grads = worker_gradient(model, x[start:start + size], y[start:start + size],
                                LOSSES[loss])
        for w, g in zip(weighted, grads, strict=True):
            w.add_(g, alpha=size / 64)
        start += size
    model.zero_grad()
    LOSSES[loss](model(x), y).backward()
    for w, p in zip(weighted, model.parameters(), strict=True):
        assert torch.allclose(w, p.grad, rtol=0, atol=1e-12)


def test_a_regression_run_learns_and_equals_the_single_process_reference(tmp_path):
    data = write_table(tmp_path / "table.csv", "mse")
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data), loss="mse",
                                model="linear", strategy="allreduce", workers=2,
                                epochs=4, lr=0.02)
    summary = polyrhythm.train(config)
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < losses[0] / 4, losses
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5
    # No accuracy anywhere, and nothing that reads the run trips over its absence.
    assert summary["final_val_accuracy"] is None
    assert [e["val_accuracy"] for e in summary["epoch_metrics"]] == [None] * 4
    assert summary["final_val_loss"] == pytest.approx(losses[-1], rel=1e-6)
    text = format_summary(summary)
    assert "acc" not in text and f"loss {summary['final_val_loss']:.4f}" in text
    store = tmp_path / "runs" / STORE_NAME
    report = write_report(store, [summary["run_id"]], tmp_path / "report", "mse", fmt="md")
    markdown = report.read_text()
    assert "no run has per-epoch validation accuracy" in markdown


def test_a_binary_run_learns_and_equals_the_single_process_reference(tmp_path):
    data = write_table(tmp_path / "table.csv", "bce")
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data), loss="bce",
                                model="linear", strategy="bsp", workers=2, epochs=4,
                                lr=0.2)
    summary = polyrhythm.train(config)
    losses = [e["val_loss"] for e in summary["epoch_metrics"]]
    accuracy = [e["val_accuracy"] for e in summary["epoch_metrics"]]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < 0.5 * math.log(2), losses  # log 2: the loss of a guess
    assert summary["final_val_accuracy"] == accuracy[-1] >= 0.85, accuracy
    assert max_diff(stored_parameters(summary), reference_parameters(config)) <= 1e-5
    assert [len(s["class_counts"]) for s in summary["data"]["shards"]] == [2, 2]


def test_the_perceptron_learns_a_binary_table_as_spark_mllib_trains_it(tmp_path):
    """The study's perceptron (two hidden layers of 15 sigmoid units, two outputs under
    cross_entropy) by full-batch gradient descent, as MLlib trains it, on the binary table."""
    data = write_table(tmp_path / "table.csv", "bce")
    config = equivalence_config(tmp_path, dataset="csv", data_path=str(data),
                                model="perceptron", workers=1)
    _, train, _ = whole_data(config)
    model = build_model(config.model, train.shape, train.classes, 0)
    assert [m.out_features for m in model if isinstance(m, nn.Linear)] == [15, 15, 2]
    x, y = train.batch(slice(None))
    loss = LOSSES["cross_entropy"]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    first = loss(model(x), y).item()
    for _ in range(300):
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).double().mean().item()
    assert loss(model(x), y).item() < first / 2 and accuracy >= 0.9, accuracy
