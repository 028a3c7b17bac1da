"""A stored run's summary as the report reads it: each part of the JSON the tables and
figures use, kept where it has the shape polyrhythm writes, left out where it does not.

The summary is JSON polyrhythm wrote, but the store may have been edited or damaged: a part
of another shape (a list where a table of hosts belongs, text where a count does) is left
out, as a run recorded before that part existed lacks it, and the table or figure it feeds
says it has no data, or shows the run without it. A summary that is not JSON at all reads as
an empty one (report/data.py). Numbers read through measures._number need no shape here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
MAX_ITEMS = 4096  # workers, hosts, classes a figure draws one by one: more is no run's


def number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def whole(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**53


def text(value: Any) -> bool:
    return type(value) is str


def maybe(check: Check) -> Check:
    return lambda value: value is None or check(value)


def items(check: Check, at_least: int = 0) -> Check:
    """A list of `at_least` to MAX_ITEMS values that pass `check`."""
    return lambda value: (type(value) is list and at_least <= len(value) <= MAX_ITEMS
                          and all(map(check, value)))


def record(optional: dict[str, Check] | None = None, **required: Check) -> Check:
    """A JSON object holding each `required` field (read as value[key]) and passing its
    check, and each `optional` one (read as value.get(key)) passing its own where it is
    there; other fields are not read."""
    def holds(value: Any) -> bool:
        return (type(value) is dict
                and all(k in value and check(value[k]) for k, check in required.items())
                and all(check(value[k]) for k, check in (optional or {}).items()
                        if k in value))
    return holds


def _shards(data: Any) -> bool:
    shard = record(worker=whole, examples=number, copies=number, imbalance=maybe(number),
                   distance=number, class_counts=items(number, 1))
    if not record(sharding=text, shards=items(shard, 1))(data):
        return False
    return len({len(s["class_counts"]) for s in data["shards"]}) == 1  # one bar per class


def _cluster(cluster: Any) -> bool:
    host = record(host=whole, emulator_bound=lambda v: v in (True, False, None),
                  cpu_share=maybe(number), used_cores=number, waiting_threads=maybe(number),
                  starved_fraction=maybe(number))
    if not record(hosts=items(host), layout=items(items(whole)), bandwidth=items(maybe(text)),
                  machine_busy=maybe(number))(cluster):
        return False
    size = min(len(cluster["layout"]), len(cluster["bandwidth"]))
    return all(h["host"] < size for h in cluster["hosts"])  # each host's entries


def _phases(value: Any) -> bool:
    return (type(value) is dict and len(value) == 2
            and all(text(k) and number(v) for k, v in value.items()))


# Each part the report reads, and the shape it reads it in.
PARTS: dict[str, Check] = {
    "per_worker": items(record(optional={"steps": maybe(number)})),
    "traffic_per_rank": items(lambda rank: type(rank) is dict),
    "compression": maybe(record(optional={"dense_share": maybe(number)})),
    "data": _shards,
    "cluster": maybe(_cluster),
    "lost_workers": items(record(worker=whole, at_s=maybe(number), pushes=maybe(number))),
    "switched_at_s": maybe(number),
    "switch_epoch": maybe(whole),
}
# A Strategy-Switch run's parts, read together (a switch run's table): all or none.
SWITCH = record(switch_epoch=maybe(whole), switch_s=maybe(number), phase_s=_phases)


def readable(summary: dict) -> dict:
    """`summary` without the parts the report reads that are not of their shape."""
    kept = {k: v for k, v in summary.items() if k not in PARTS or PARTS[k](v)}
    if "switch_rule" in kept and not SWITCH(kept):
        del kept["switch_rule"]
    return kept
