"""TreeEASGD (tree-easgd): its tree and its elastic pull (pure), and real runs: every model
sent on its cadences arrives and is pulled toward, the run learns, a compressor is refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import polyrhythm
from helpers import small_config
from polyrhythm.config import RunConfig
from polyrhythm.errors import ConfigError
from polyrhythm.strategies.decentralised import elastic_pull, tree_children, tree_parent


@given(st.integers(1, 200))
def test_the_workers_form_one_binary_tree(n):
    """Every worker but the root has one parent, whose children it is among; every worker
    reaches the root; nobody has more than two children."""
    assert tree_parent(0) is None
    for i in range(n):
        children = tree_children(i, n)
        assert len(children) <= 2 and all(tree_parent(c) == i for c in children)
        hops, node = 0, i
        while (node := tree_parent(node)) is not None:
            hops += 1
        assert hops <= n.bit_length()  # depth log2 N: a worker's models reach the root
    assert sorted(c for i in range(n) for c in tree_children(i, n)) == list(range(1, n))


def test_an_elastic_pull_moves_alpha_of_the_way_and_a_mutual_one_keeps_the_mean():
    w, other = torch.tensor([0.0, 4.0]), torch.tensor([4.0, 0.0])
    assert torch.equal(elastic_pull(w, other, 0.0), w)
    assert torch.equal(elastic_pull(w, other, 1.0), other)
    assert torch.equal(elastic_pull(w, other, 0.25), torch.tensor([1.0, 3.0]))
    a, b = elastic_pull(w, other, 0.3), elastic_pull(other, w, 0.3)  # both sent at once
    assert torch.allclose((a + b) / 2, (w + other) / 2)


def expected_models(n: int, steps: int, tau_up: int, tau_down: int) -> list[tuple[int, int]]:
    """(models sent, models received) by each of n workers in `steps` steps: to its parent
    every tau_up steps, to its children every tau_down steps."""
    sent, received = [0] * n, [0] * n
    for i in range(n):
        parent, children = tree_parent(i), tree_children(i, n)
        ups = steps // tau_up if parent is not None else 0
        downs = steps // tau_down
        sent[i] = ups + downs * len(children)
        if parent is not None:
            received[parent] += ups
        for c in children:
            received[c] += downs
    return list(zip(sent, received, strict=True))


def test_every_model_sent_on_its_cadences_arrives_and_each_neighbour_says_done(tmp_path):
    """5 workers (0 -> 1, 2; 1 -> 3, 4), 20 steps, to the parent every 2, to the children
    every 5; the slowest worker is 30 ms slower a step so that models and DONEs arrive while
    others still train: whatever the timing, the counts are the cadences'."""
    config = small_config(tmp_path, strategy="tree-easgd", workers=5, epochs=2, tau_up=2,
                          tau_down=5, worker_delay_s=[0.03, 0, 0, 0, 0])
    summary = polyrhythm.train(config)
    assert [w["steps"] for w in summary["per_worker"]] == [20] * 5
    traffic = {r["rank"]: r for r in summary["traffic_per_rank"]}
    neighbours = [2, 3, 1, 1, 1]  # parent and children of each worker
    words = summary["parameters"] + 1
    for i, (sent, received) in enumerate(expected_models(5, 20, 2, 5)):
        rank = traffic[i]
        assert rank["messages_sent"] == sent + neighbours[i]  # models, then a DONE each
        assert rank["messages_received"] == received + neighbours[i]
        assert rank["bytes_sent"] == rank["messages_sent"] * 4 * words
    assert summary["tree_pulls"] == expected_models(5, 20, 2, 5)[0][1]  # worker 0's


def test_one_worker_is_a_root_alone_that_trains_as_local_sgd_would(tmp_path):
    job = {"workers": 1, "epochs": 1, "threads": 1, "seed": 2}
    alone = polyrhythm.train(small_config(tmp_path / "tree", strategy="tree-easgd", **job))
    local = polyrhythm.train(small_config(tmp_path / "local", strategy="localsgd", **job))
    assert alone["final_val_loss"] == local["final_val_loss"]
    assert alone["tree_pulls"] == 0


def test_a_compressor_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        RunConfig(strategy="tree-easgd", workers=3, compression={"name": "topk"})
    assert str(refused.value) == ("strategy 'tree-easgd' sends its models uncompressed; drop "
                                  "--compress topk")


def test_tree_easgd_trains_mnist5k_with_4_workers(tmp_path):
    """The default cnn on mnist5k, as every strategy is (test_strategies.py): >= 0.85 in 2
    epochs; every worker pulled toward the models it received."""
    summary = polyrhythm.train(strategy="tree-easgd", workers=4, epochs=2, out=str(tmp_path))
    assert summary["final_val_accuracy"] >= 0.85, summary["final_val_accuracy"]
    assert summary["tree_pulls"] == 2 * 70 // 2 * 2  # worker 0: its 2 children, every 2 steps
