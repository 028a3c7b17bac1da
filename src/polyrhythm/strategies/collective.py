"""The collective strategies: no servers; workers sum their batch-weighted gradients and each
steps an identical optimizer copy (all-reduce SGD, as DDP and Horovod). They differ in how the
sum travels (strategies/allreduce.py, comm/collectives.py)."""

from __future__ import annotations

from polyrhythm.strategies.spec import COLLECTIVE, EVERY_WORKERS, StrategySpec

WORKER = "polyrhythm.strategies.allreduce:AllReduceWorker"

# Every worker steps the same mean gradient: each update applies every worker's.
AS_ONE = {"family": COLLECTIVE, "updates_from": EVERY_WORKERS, "regroups": True}

ALLREDUCE = StrategySpec(
    "allreduce", "synchronous all-reduce (Gloo) with an optimizer copy per worker",
    source="the engine's native collective", **AS_ONE, worker=WORKER)

RING = StrategySpec(
    "ring", "synchronous all-reduce as a ring over point-to-point messages (reduce-scatter + "
    "all-gather)", source="Patarasuk and Yuan 2009; Baidu, Horovod", **AS_ONE,
    worker=WORKER, worker_args={"algorithm": "ring"})

REDUCE_BROADCAST = StrategySpec(
    "reduce-broadcast", "synchronous all-reduce through worker 0, which sums every gradient "
    "and sends the sum back", source="TensorFlow's \"pscpu\" all-reduce", **AS_ONE,
    worker=WORKER, worker_args={"algorithm": "reduce-broadcast"})

TREE = StrategySpec(
    "tree", "synchronous all-reduce as a binomial-tree reduce and broadcast",
    source="Thakur, Rabenseifner and Gropp 2005", **AS_ONE, worker=WORKER,
    worker_args={"algorithm": "tree"})
