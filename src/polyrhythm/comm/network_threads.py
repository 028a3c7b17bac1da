"""Gloo's network threads on a core they share with the rest of the job.

Gloo's TCP transport reads every connection of a process group on one event-loop thread
(named `gloo_tcp_loop`). When data arrives while another thread of the process holds that
connection's lock (sending on it, or posting a receive), the loop thread does not block on
the lock: it returns to epoll, which reports the same data again at once, and it spins. On a
core of its own that costs microseconds. On a core shared with the thread holding the lock,
as when ranks outnumber the cores this process may run on (two ranks pinned to one core,
sixteen emulated workers on two cores), the woken loop thread preempts the holder and then
spins through its whole scheduler slice while the holder waits to run: a 4 KB message and
its reply between two processes on one core took 4 ms here (0.06 ms on two cores).

At the lowest priority (nice 19) the loop thread no longer preempts the thread holding the
lock, and it runs whenever the core has nothing more urgent, which is when its process
waits for the message: the same round trip takes 0.26 ms. Only a process whose ranks
outnumber its cores is changed; one with a core per rank keeps Gloo as it is, so that other
busy processes on a real node cannot starve its network thread.
"""

from __future__ import annotations

import contextlib
import os

LOOP_THREAD = "gloo_tcp_loop"
LOWEST = 19  # nice


def sharing_cores(local_ranks: int) -> bool:
    """Whether this machine's `local_ranks` ranks outnumber the cores this process may use."""
    return len(os.sched_getaffinity(0)) < local_ranks


def calm_network_threads() -> int:
    """Set this process's Gloo loop threads to the lowest priority (those made since the
    last call too: each process group has its own); how many there are."""
    calmed = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() != LOOP_THREAD:
                    continue
            os.setpriority(os.PRIO_PROCESS, int(tid), LOWEST)  # a thread id: that thread
            calmed += 1
    return calmed
