"""What a parameter server does with one message: pure, no I/O, no tensors.

The real server (runtime/server/server.py) and the simulator (sim/ps.py) both call `serve` (the
simulator its plain-tuple form, `decide`) for every message a bucket gets, so they make the
same decisions: which policy hook to ask, what staleness a gradient had, whether the pending
update is applied now, and whether that update ends the run. Each then acts on the answer in
its own way (tensors and replies on the wire, or costs and simulated links). The message
layout on the wire is comm/messages.py's; the kinds of message are here, where both sides can
import them (the simulator never imports comm).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Protocol

from polyrhythm.strategies.consistency import ConsistencyPolicy, Decision

# A message's kind, a sum of flags: GRADIENT (the values are a gradient, or another update
# for the policy, e.g. an elastic difference), REPLY (the worker waits for the parameters),
# DONE (the worker leaves). A usual push is GRADIENT + REPLY; Downpour pushes without
# fetching and fetches without pushing.
GRADIENT, REPLY, DONE = 1, 2, 4
PUSH = GRADIENT | REPLY
FETCH = REPLY

# Batch shares like 1/3 do not add up to whole global batches exactly.
TOLERANCE = 1e-6


class BucketState(Protocol):
    """What `serve` reads of a bucket (the real one, runtime/server/server.py Bucket, or the
    simulator's): its policy and its counts. An update adds 1 to `version` and the pending
    batch weight to `progress`."""

    policy: ConsistencyPolicy
    version: int  # updates applied
    progress: float  # global batches' worth of gradient applied: the batch weights' sum
    pending_weight: float  # batch weight accumulated since the last update

    @property
    def over(self) -> bool:  # the bucket has ended training
        ...


class Course(NamedTuple):
    """How long the run is, as the servers count it: `rounds` global batches, counted in
    updates where the policy has fixed rounds (k-BSP, backup workers), or with shared epochs
    in gradient applied (the batch weights' sum, whoever computed them)."""

    rounds: int
    shared_epochs: bool = False


class Served(NamedTuple):
    """What the server does with a message."""

    decision: Decision  # the policy's: accumulate (this message's values, with `scale`),
    #                     release (the workers to answer now)
    staleness: int | None  # the accumulated gradient's, to record; None: nothing accumulated
    update: bool  # apply the pending update now (the policy's update, with something pending)
    ends: bool  # that update completes the run: the bucket ends training


# Builds a Served without the Python-level __new__ a NamedTuple call goes through.
_served = partial(tuple.__new__, Served)


def serve(bucket: BucketState, course: Course, kind: int, worker: int, clock: int,
          pulled: int, weight: float) -> Served:
    """Decide what `bucket`'s server does with a message of `kind` from `worker`: its clock
    (pushes made), the version it last pulled and its batch weight. Only the policy changes
    (it learns of the push or the leave); the bucket's counts are the caller's to update:
    add `weight` to the pending weight when the decision accumulates, then apply the update
    if `update` says so, then end the bucket if `ends` does."""
    return _served(decide(bucket, course, kind, worker, clock, pulled, weight))


def decide(bucket: BucketState, course: Course, kind: int, worker: int, clock: int,
           pulled: int, weight: float) -> tuple[Decision, int | None, bool, bool]:
    """`serve`'s answer as a plain tuple, in Served's order: what the simulator calls, a
    million times in a run of its benchmark, where building the Served would be a tenth of
    its time."""
    policy = bucket.policy
    if kind & DONE:
        decision = policy.on_done(worker)
        if decision.accumulate:  # a leaving worker sends no values, whatever the policy says
            decision = decision._replace(accumulate=False)
        staleness, pending = None, bucket.pending_weight
    elif not kind & GRADIENT or bucket.over:
        # A fetch: the current parameters, whatever the policy; or late work after the last
        # update: cancelled, and the worker told at once that training is over.
        return Decision(accumulate=False, release=(worker,)), None, False, False
    else:
        staleness = bucket.version - pulled
        decision = policy.on_push(worker, clock, staleness)
        if not kind & REPLY:  # pushed without waiting: nobody to answer
            decision = decision._replace(release=tuple(w for w in decision.release
                                                       if w != worker))
        if decision.accumulate:
            pending = bucket.pending_weight + weight
        else:
            staleness, pending = None, bucket.pending_weight
    update = decision.update and pending > 0
    ends = update and (
        (policy.fixed_rounds and bucket.version + 1 >= course.rounds)
        or (course.shared_epochs and bucket.progress + pending >= course.rounds - TOLERANCE))
    return decision, staleness, update, ends
