"""Spark MLlib's map-reduce training, as a strategy: the training set is a cached,
partitioned Spark dataset (a partition per worker's shard); each mini-batch is one Spark job
whose tasks compute the gradient of their partition's share of the batch in the executors,
tree-aggregated to the driver, which steps the optimizer and broadcasts the new parameters
to the next job. Synchronous by construction: the driver steps once every task has answered.
It runs on Spark only (launch/launchers/mapreduce.py); a batch as large as the training set is
full-batch gradient descent, as MLlib's GD."""

from __future__ import annotations

from polyrhythm.strategies.spec import MAP_REDUCE, StrategySpec

MAPREDUCE = StrategySpec(
    "mapreduce", "Spark MLlib's training: a Spark job per mini-batch over a cached "
    "partitioned dataset, gradients tree-aggregated to the driver, which steps and broadcasts "
    "the model (runs on Spark)",
    source="the asynchronous-training thesis's Spark MLlib against parameter server study",
    family=MAP_REDUCE)
