"""The simulator's event queue: events in time order, ties in the order they were added.

A heap of plain float times, each pending time once, and a dict from a time to its event:
comparing floats is much cheaper than comparing (time, sequence number, ...) tuples, and a
million-push simulation does about twenty comparisons per event. Events at a time already
pending (rare, but common where compute or links take no time) wait in a queue of that time,
so they come out in the order they were added, as a sequence number would order them.

Most events add exactly one other (a step computed: its push; a push served: the worker's
next step), so the time of the event being acted on stays at the heap's root until then and
the new time replaces it, one sift instead of a pop's and a push's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

# An event: its time first, then what the simulator wants to know of it.
Event = tuple


class Agenda:
    """Pending events, by time."""

    __slots__ = ("times", "at", "tied", "spent")

    def __init__(self) -> None:
        self.times: list[float] = []  # a heap: each pending time once (and `spent`'s)
        self.at: dict[float, Event] = {}  # each pending time's next event
        self.tied: dict[float, deque[Event]] = {}  # the events after it at that time
        self.spent = False  # the heap's root is the time of the event taken last, now done

    def add(self, event: Event) -> None:
        """Add `event`, due at its first item."""
        t = event[0]
        if self.at.setdefault(t, event) is not event:
            tied = self.tied.get(t)
            if tied is None:
                tied = self.tied[t] = deque()
            tied.append(event)
        elif self.spent:
            self.spent = False
            heapq.heapreplace(self.times, t)
        else:
            heapq.heappush(self.times, t)

    def __iter__(self) -> Iterator[Event]:
        """Each event in turn, until none is left (acting on one may add others)."""
        times, at, tied, pop = self.times, self.at, self.tied, heapq.heappop
        while True:
            if self.spent:  # acting on the last event added nothing
                self.spent = False
                pop(times)
            if not times:
                return
            t = times[0]
            event = at.pop(t)
            if tied and t in tied:  # the next event at t comes forward
                after = tied[t]
                at[t] = after.popleft()
                if not after:
                    del tied[t]
            else:
                self.spent = True
            yield event
