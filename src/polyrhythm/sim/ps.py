"""The parameter-server family, simulated: the servers' decisions are the real policies'.

Each worker computes a step, pushes each bucket as backward produces it (the first third of
a step is forward, then buckets are ready evenly through backward), and waits for every
bucket's reply, as strategies/ps.py does; when to push and fetch is the real `PushFetch`
cadence (Downpour). Each server takes its pushes in arrival order, one at a time, and asks
the bucket's policy (strategies/consistency.py, the very class the real server runs) what to
do, through the very function the real server decides with (strategies/serving.py): adding
a gradient costs its share of R_w (and of decoding a compressed push), an update its share of
U_w, and each worker released gets the bucket back over the network (sim/network.py). Under
compression a push and a reply have their compressed sizes and a worker's step that pushes
takes its encoding time too (sim/compressed.py). Staleness is counted as the real server
counts it: the bucket's version at the push minus the one the worker last pulled. The run
ends as the real one does: after the policy's fixed rounds, or with shared epochs once the
run's global batches' worth of gradient is applied (each push adds its worker's batch
weight, whoever computed it), else when each worker has taken its steps.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter

from polyrhythm.sim.compressed import HEADER
from polyrhythm.sim.network import Network
from polyrhythm.sim.result import SimResult, WorkerLog
from polyrhythm.sim.setup import Setup
from polyrhythm.strategies.cadence import PushFetch
from polyrhythm.strategies.consistency import ConsistencyPolicy
from polyrhythm.strategies.serving import DONE, GRADIENT, REPLY, Course, Served, serve

# Event kinds: a worker's step computed; a bucket's gradient ready (mid-backward); a message
# reaching a server. A message takes a link when its event fires, in time order, so pushes
# of many workers queue at a server in the order they were sent.
COMPUTED, READY, MESSAGE = 0, 1, 2
# An event's flags: the message's kind, and above its bits the clock the worker sent it with
# (a Downpour worker may step on before its push reaches the server).
KIND, CLOCK_SHIFT = GRADIENT | REPLY | DONE, 3


def simulate_ps(setup: Setup, name: str, make_policy, settings, *, net: Network | None = None,
                start: list[float] | None = None, logs: list[WorkerLog] | None = None,
                done: int = 0) -> SimResult:
    """Simulate a parameter-server strategy; `make_policy()` builds one bucket's policy,
    `settings` the strategy's (push_every, fetch_every). A Strategy-Switch's second phase
    starts from its first: the network as it left it, each worker's time `start`, its
    `logs`, and the `done` steps whose updates the servers took over."""
    return _ParameterServers(setup, make_policy, settings, net, logs, done).run(name, start)


class SimulatedBucket:
    """A simulated bucket: what the real one (runtime/server.py Bucket) counts, without its
    values."""

    __slots__ = ("policy", "version", "progress", "pending_weight", "over")

    def __init__(self, policy: ConsistencyPolicy, version: int = 0) -> None:
        self.policy = policy
        # Updates applied, and global batches' worth of gradient: after a Strategy-Switch's
        # first phase, its steps (runtime/server.py Bucket.take_over).
        self.version = version
        self.progress = float(version)
        self.pending_weight = 0.0
        self.over = False

    def take(self, course: Course, kind: int, worker: int, clock: int, pulled: int,
             weight: float) -> Served:
        """The message's decision (serve), counted as the real bucket counts it: the pushed
        batch weight while pending, the update, the end."""
        served = serve(self, course, kind, worker, clock, pulled, weight)
        if served.decision.accumulate:
            self.pending_weight += weight
        if served.update:
            self.progress += self.pending_weight
            self.pending_weight = 0.0
            self.version += 1
            if served.ends:
                self.over = True
        return served


class _ParameterServers:
    def __init__(self, setup: Setup, make_policy, settings, net: Network | None,
                 logs: list[WorkerLog] | None, done: int) -> None:
        self.setup = setup
        n, buckets = setup.workers, setup.buckets
        self.net = net or setup.network()
        self.buckets = [SimulatedBucket(make_policy(), done) for _ in buckets]
        self.course = Course(setup.iterations, setup.shared_epochs)
        self.weight = setup.weights
        # With shared epochs a worker takes steps until the servers end the run.
        self.steps = math.inf if setup.shared_epochs else setup.iterations
        total = max(1, sum(setup.values))
        costs = setup.costs
        self.update_s = [costs.update_s * size / total for size in setup.values]
        # Adding a pushed gradient, after decoding it where it came compressed.
        self.reduce_s = [(costs.reduce_s + setup.codecs.server) * size / total
                         for size in setup.values]
        self.server_host = [setup.host[s] for s in range(setup.servers)]
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
        self.reply_size = setup.replies
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
                         self.net.received, self.busy_s,
                         max((b.version for b in self.buckets), default=0))

    def _begin(self, t: float, w: int) -> None:
        """Worker w is free at t: it leaves, or computes a step, whose buckets are ready
        through backward (the last when the step's compute ends)."""
        s, log = self.setup, self.logs[w]
        if self.stopping[w] or log.steps >= self.steps:
            self._leave(t, w)
            return
        seconds = s.compute[w]()
        log.begin_step(t, s.batch[w])  # first: it zeroes the warm-up's figures
        log.compute_s += seconds
        pushing, fetching = self.cadence[w].step()
        if pushing and s.codecs.push:  # encoding its pushes (and decoding the replies)
            log.compress_s += s.codecs.push
            seconds += s.codecs.push
        flags = (GRADIENT if pushing else 0) | (REPLY if fetching else 0) | (
            self.cadence[w].pushes << CLOCK_SHIFT)
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
            self._at(arrives, MESSAGE, w, k, DONE)  # with clock 0, as the real worker's

    def _serve(self, t: float, w: int, k: int, flags: int) -> None:
        # The simulator's hottest path (a million pushes in seconds): locals, one branch
        # for the usual single reply.
        bucket, cost = self.buckets[k], self.message_s  # taking the message in
        served = bucket.take(self.course, flags & KIND, w, flags >> CLOCK_SHIFT, self.pulled[w][k],
                             self.weight[w])
        staleness = served.staleness
        if staleness is not None:  # a gradient accumulated
            counts = self.staleness
            counts[staleness] = counts.get(staleness, 0) + 1
            cost += self.reduce_s[k]
        if served.update:
            cost += self.update_s[k]
        version = bucket.version
        logs, release = self.logs, served.decision.release
        released = release if len(release) == 1 and not logs[release[0]].end else [
            r for r in release if not logs[r].end]  # not gone already
        server = self.bucket_server[k]
        cost += self.message_s * len(released)  # each reply
        busy = self.busy[server]
        done = self.busy[server] = (t if t > busy else busy) + cost
        self.busy_s[server] += cost
        host, size, over = self.server_host[server], self.reply_size[k], bucket.over
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
