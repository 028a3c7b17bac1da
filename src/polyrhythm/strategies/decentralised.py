"""The decentralised strategies: no parameter servers, the workers keep each other consistent.

- `localsgd`: local SGD with model averaging every tau steps (SparkNet, Moritz et al.,
  "SparkNet: Training Deep Networks in Spark", ICLR 2016; Lin et al., "Don't Use Large
  Mini-Batches, Use Local SGD", ICLR 2020).
- `dpsgd`: decentralised parallel SGD on a ring (Lian et al., "Can Decentralized Algorithms
  Outperform Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic
  Gradient Descent", NIPS 2017).
- `gossip`: GoSGD, asynchronous randomised gossip with sum weights (Blot, Picard, Cord and
  Thome, "Gossip training for deep learning", 2016).
- `tree-easgd`: TreeEASGD, elastic averaging between neighbours of a tree, asynchronous
  (Zhang, "Distributed stochastic optimization for deep learning", PhD thesis, NYU 2016;
  as the lecture slides on parameter servers give its algorithm).

This module holds their declarations and their mixing rules, pure functions of any value
type (floats, Fractions, tensors), which the tests and a simulator use without processes. The
workers that run them are in strategies/averaging.py (tree-easgd's in
strategies/tree_easgd.py); when they communicate is decided by the cadences in
strategies/cadence.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from polyrhythm.limits import MAX_PERIOD
from polyrhythm.settings import Param, at_least, within
from polyrhythm.strategies.parameter_server import ALPHA, TAU
from polyrhythm.strategies.spec import DECENTRALISED, StrategySpec

Value = TypeVar("Value")  # a float, a Fraction or a tensor: the pure functions take any

WORKERS = "polyrhythm.strategies.averaging"

LOCALSGD = StrategySpec(
    "localsgd", "local SGD: tau local steps, then the models are averaged (batch-weighted "
    "all-reduce)", source="SparkNet, Moritz et al. 2016; Lin et al. 2020",
    family=DECENTRALISED, worker=f"{WORKERS}:LocalSGDWorker", params=(TAU,),
    regroups=True)

DPSGD = StrategySpec(
    "dpsgd", "D-PSGD: every step each worker averages its model with its ring neighbours'",
    source="D-PSGD, Lian et al., NIPS 2017", family=DECENTRALISED,
    worker=f"{WORKERS}:RingExchangeWorker", regroups=True)

GOSSIP = StrategySpec(
    "gossip", "GoSGD: after a step, with probability p, send the model and half its weight "
    "to a random peer", source="GoSGD, Blot et al. 2016", family=DECENTRALISED,
    worker="polyrhythm.strategies.gossip:GossipWorker", regroups=True, params=(
        Param("gossip_p", float, "probability of sending the model to a random peer after a "
              "step", 0.2, rule=within(0, 1, low_open=True)),))


TREE_EASGD = StrategySpec(
    "tree-easgd", "TreeEASGD: workers in a binary tree; every tau_up steps a worker sends its "
    "model to its parent, every tau_down steps to its children; a model received pulls its "
    "own toward it by alpha", source="TreeEASGD, Zhang 2016", family=DECENTRALISED,
    worker="polyrhythm.strategies.tree_easgd:TreeElasticWorker", compressible=False,
    regroups=True, params=(
        Param("tau_up", int, "steps between a worker's sends to its parent", 2,
              rule=at_least(1, MAX_PERIOD)),
        Param("tau_down", int, "steps between a worker's sends to its children", 2,
              rule=at_least(1, MAX_PERIOD)),
        ALPHA))


def tree_parent(index: int) -> int | None:
    """Worker `index`'s parent in the binary tree of workers 0..N-1 (heap order: worker 0 the
    root, worker i's children 2i+1 and 2i+2); None for the root."""
    return None if index == 0 else (index - 1) // 2


def tree_children(index: int, n: int) -> list[int]:
    """Worker `index`'s children in the binary tree of n workers (none for a leaf)."""
    return [c for c in (2 * index + 1, 2 * index + 2) if c < n]


def elastic_pull(w: Value, other: Value, alpha: float) -> Value:
    """TreeEASGD's mixing of a model received: w + alpha (other - w)."""
    return w + alpha * (other - w)


def ring_neighbours(index: int, n: int) -> list[int]:
    """The distinct other workers next to `index` on a ring of n: none, one (n = 2) or two."""
    return sorted({(index - 1) % n, (index + 1) % n} - {index})


def mixing_weights(index: int, n: int) -> dict[int, float]:
    """Row `index` of D-PSGD's mixing matrix: uniform over the worker and its ring neighbours.

    The matrix is symmetric, so it is doubly stochastic: averaging keeps the mean model.
    """
    members = [index, *ring_neighbours(index, n)]
    return {j: 1.0 / len(members) for j in members}


def mix(models: Mapping[int, Value], weights: Mapping[int, float]) -> Value:
    """sum_j weights[j] models[j]: one row of the mixing matrix applied to the models."""
    return sum(weights[j] * models[j] for j in weights)


def gossip_send_share(alpha: Value) -> tuple[Value, Value]:
    """GoSGD's sender: (alpha it keeps, alpha it sends with its model); they sum to alpha."""
    share = alpha / 2
    return alpha - share, share


def gossip_merge(w_j: Value, alpha_j: Value, w_i: Value, alpha_i: Value
                 ) -> tuple[Value, Value]:
    """GoSGD's receiver j of (w_i, alpha_i): the alpha-weighted mean model and the summed alpha."""
    alpha = alpha_i + alpha_j
    return w_j * (alpha_j / alpha) + w_i * (alpha_i / alpha), alpha
