"""The parameter-server family, simulated: the servers' decisions are the real policies'.

Each worker computes a step, pushes each bucket as backward produces it (the first third of
a step is forward, then buckets are ready evenly through backward), and waits for every
bucket's reply, as strategies/ps.py does; when to push and fetch is the real `PushFetch`
cadence (Downpour). Each server takes its pushes in arrival order, one at a time, and asks
the bucket's policy (strategies/consistency.py, the very class the real server runs) what to
do: adding a gradient costs its share of R_w, an update its share of U_w, and each worker
released gets the bucket back over the network (sim/network.py). Staleness is counted as the
real server counts it: the bucket's version at the push minus the one the worker last
pulled.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from polyrhythm.sim.network import Network
from polyrhythm.sim.result import SimResult, WorkerLog
from polyrhythm.sim.setup import HEADER, Setup
from polyrhythm.strategies.cadence import PushFetch
from polyrhythm.strategies.consistency import Decision

# Event kinds: a worker's step computed; a bucket's gradient ready (mid-backward); a message
# reaching a server. A message takes a link when its event fires, in time order, so pushes
# of many workers queue at a server in the order they were sent.
COMPUTED, READY, MESSAGE = 0, 1, 2
GRADIENT, REPLY, DONE = 1, 2, 4  # a message's kind, as in comm/messages.py


def simulate_ps(setup: Setup, name: str, make_policy, settings, *, net: Network | None = None,
                start: list[float] | None = None, logs: list[WorkerLog] | None = None,
                done: int = 0) -> SimResult:
    """Simulate a parameter-server strategy; `make_policy()` builds one bucket's policy,
    `settings` the strategy's (push_every, fetch_every). A Strategy-Switch's second phase
    starts from its first: the network as it left it, each worker's time `start`, its
    `logs`, and the `done` steps whose updates the servers took over."""
    return _ParameterServers(setup, make_policy, settings, net, logs, done).run(name, start)


class _ParameterServers:
    def __init__(self, setup: Setup, make_policy, settings, net: Network | None,
                 logs: list[WorkerLog] | None, done: int) -> None:
        self.setup = setup
        n, buckets = setup.workers, setup.buckets
        self.net = net or setup.network()
        self.policies = [make_policy() for _ in buckets]
        self.rounds = setup.iterations if self.policies[0].fixed_rounds else None
        total = sum(size for _, size in buckets)
        costs = setup.costs
        self.update_s = [costs.update_s * size / total for _, size in buckets]
        self.reduce_s = [costs.reduce_s * size / total for _, size in buckets]
        self.server_host = [setup.host[s] for s in range(setup.servers)]
        self.version = [done] * len(buckets)
        self.over = [False] * len(buckets)
        self.pulled = [[done] * len(buckets) for _ in range(n)]
        self.busy = [0.0] * setup.servers  # when each server is next free
        self.busy_s = [0.0] * setup.servers
        self.cadence = [PushFetch(settings.get("push_every", 1), settings.get("fetch_every", 1))
                        for _ in range(n)]
        self.logs = logs or [WorkerLog(setup.warmup) for _ in range(n)]
        self.awaiting = [0] * n  # replies a worker still waits for
        self.replied = [0.0] * n  # when its latest reply arrived
        self.computed = [0.0] * n  # when its step's compute ended
        self.stopping = [False] * n
        self.staleness: dict[int, int] = {}
        self.events: list = []
        self._order = itertools.count().__next__  # ties go in the order they were made
        self.worker_host = [setup.worker_host(w) for w in range(n)]
        self.count = len(buckets)
        self.bucket_server = [server for server, _ in buckets]
        self.bucket_size = [size for _, size in buckets]
        self.message_s = costs.message_s

    def _at(self, t: float, kind: int, w: int, k: int, flags: int) -> None:
        heapq.heappush(self.events, (t, self._order(), kind, w, k, flags))

    def run(self, name: str, start: list[float] | None) -> SimResult:
        for w in range(self.setup.workers):
            self._begin(start[w] if start else 0.0, w)
        events, pop = self.events, heapq.heappop
        serve, push, computed = self._serve, self._push, self._computed
        while events:
            t, _, kind, w, k, flags = pop(events)
            if kind == MESSAGE:
                serve(t, w, k, flags)
            elif kind == READY:
                push(t, w, k, flags)
            else:
                computed(t, w, flags)
        s = self.setup
        return SimResult(name, s.workers, s.servers, self.logs,
                         max(log.end for log in self.logs), Counter(self.staleness), self.net.sent,
                         self.net.received, self.busy_s, max(self.version, default=0))

    def _begin(self, t: float, w: int) -> None:
        """Worker w is free at t: it leaves, or computes a step, whose buckets are ready
        through backward (the last when the step's compute ends)."""
        s, log = self.setup, self.logs[w]
        if self.stopping[w] or log.steps >= s.iterations:
            self._leave(t, w)
            return
        seconds = s.compute[w]()
        log.compute_s += seconds
        log.begin_step(t, s.batch[w])
        pushing, fetching = self.cadence[w].step()
        flags = (GRADIENT if pushing else 0) | (REPLY if fetching else 0)
        end = self.computed[w] = t + seconds
        count = self.count
        if fetching:  # before any push goes: a reply may come before the compute ends
            self.awaiting[w], self.replied[w] = count, end
        if pushing and count > 1:
            for k in range(count - 1):
                self._at(t + seconds * (1 + 2 * (k + 1) / count) / 3, READY, w, k, flags)
        self._at(end, COMPUTED, w, 0, flags)

    def _computed(self, t: float, w: int, flags: int) -> None:
        if flags & GRADIENT:  # the last bucket (the others went through backward)
            self._push(t, w, self.count - 1, flags)
        elif flags & REPLY:  # a fetch without a push
            for k in range(self.count):
                self._push(t, w, k, flags)
        if not flags & REPLY:  # Downpour between fetches: on once the pushes are out
            self._begin(max(t, self.net.out_free[self.worker_host[w]]), w)

    def _push(self, t: float, w: int, k: int, flags: int) -> None:
        arrives = self.net.send(t + self.message_s, self.worker_host[w],
                                self.server_host[self.bucket_server[k]],
                                self.bucket_size[k] if flags & GRADIENT else HEADER)
        self._at(arrives, MESSAGE, w, k, flags)

    def _leave(self, t: float, w: int) -> None:
        """The worker is done: it tells every bucket's server (the real worker's DONE)."""
        self.logs[w].end = t
        for k, server in enumerate(self.bucket_server):
            arrives = self.net.send(t, self.worker_host[w], self.server_host[server], HEADER)
            self._at(arrives, MESSAGE, w, k, DONE)

    def _serve(self, t: float, w: int, k: int, flags: int) -> None:
        # The simulator's hottest path (a million pushes in seconds): locals, one branch
        # for the usual single reply.
        policy, cost = self.policies[k], self.message_s  # taking the message in
        if flags & DONE:
            decision = policy.on_done(w)
        elif flags & GRADIENT and self.over[k]:  # late work after the last round: cancelled
            decision = Decision(accumulate=False, release=(w,))
        elif flags & GRADIENT:
            staleness = self.version[k] - self.pulled[w][k]
            decision = policy.on_push(w, self.cadence[w].pushes, staleness)
            if decision.accumulate:
                counts = self.staleness
                counts[staleness] = counts.get(staleness, 0) + 1
                cost += self.reduce_s[k]
            if not flags & REPLY:
                decision = Decision(decision.accumulate, decision.update,
                                    tuple(r for r in decision.release if r != w))
        else:  # a fetch
            decision = Decision(accumulate=False, release=(w,))
        version = self.version[k]
        if decision.update:
            cost += self.update_s[k]
            version = self.version[k] = version + 1
            if self.rounds is not None and version >= self.rounds:
                self.over[k] = True
        logs, release = self.logs, decision.release
        released = release if len(release) == 1 and not logs[release[0]].end else [
            r for r in release if not logs[r].end]  # not gone already
        server = self.bucket_server[k]
        cost += self.message_s * len(released)  # each reply
        busy = self.busy[server]
        done = self.busy[server] = (t if t > busy else busy) + cost
        self.busy_s[server] += cost
        host, size, over = self.server_host[server], self.bucket_size[k], self.over[k]
        if len(released) == 1:
            r = released[0]
            self.pulled[r][k] = version
            self._reply(r, self.net.send(done, host, self.worker_host[r], size), over)
        elif released:  # a round's replies, sent at once: they share the server's link
            arrivals = self.net.send_together(done, host,
                                              [(self.worker_host[r], size) for r in released])
            for r, arrives in zip(released, arrivals, strict=True):
                self.pulled[r][k] = version
                self._reply(r, arrives, over)
        # The server's loop waits for its replies to be sent before it takes the next push
        # (runtime/server.py _act).
        sent = self.net.out_free[host]
        if sent > self.busy[server]:
            self.busy[server] = sent

    def _reply(self, w: int, arrives: float, over: bool) -> None:
        replied = self.replied
        if arrives > replied[w]:
            replied[w] = arrives
        if over:
            self.stopping[w] = True
        left = self.awaiting[w] = self.awaiting[w] - 1
        if left == 0:  # the last bucket goes when compute ends: its reply after
            self.logs[w].wait_s += replied[w] - self.computed[w]
            self._begin(replied[w], w)
