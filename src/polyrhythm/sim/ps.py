"""The parameter-server family, simulated: the servers' decisions are the real policies'.

Each worker computes a step, pushes each bucket as backward produces it (the first third of
a step is forward, then buckets are ready evenly through backward), and waits for every
bucket's reply, as strategies/ps_worker.py does; when to push and fetch is the real `PushFetch`
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

import math
from collections import Counter, defaultdict

from polyrhythm.sim.agenda import Agenda
from polyrhythm.sim.compressed import HEADER
from polyrhythm.sim.network import Network
from polyrhythm.sim.result import SimResult, WorkerLog
from polyrhythm.sim.setup import Setup, drawn
from polyrhythm.strategies.cadence import PushFetch
from polyrhythm.strategies.consistency import ConsistencyPolicy, Decision
from polyrhythm.strategies.serving import DONE, GRADIENT, REPLY, Course, Served, decide

# Events (sim/agenda.py): a worker's step computed, a bucket's gradient ready (mid-backward),
# a message reaching a server. A message takes a link when its event fires, in time order, so
# pushes of many workers queue at a server in the order they were sent.
COMPUTED, READY, MESSAGE = 0, 1, 2
# A message's flags: the message's kind, and above its bits the clock the worker sent it with
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
    """A simulated bucket: what the real one (runtime/server/server.py Bucket) counts, without its
    values."""

    __slots__ = ("policy", "version", "progress", "pending_weight", "over")

    def __init__(self, policy: ConsistencyPolicy, version: int = 0) -> None:
        self.policy = policy
        # Updates applied, and global batches' worth of gradient: after a Strategy-Switch's
        # first phase, its steps (runtime/server/server.py Bucket.take_over).
        self.version = version
        self.progress = float(version)
        self.pending_weight = 0.0
        self.over = False

    def take(self, course: Course, kind: int, worker: int, clock: int, pulled: int,
             weight: float) -> Served:
        """The message's decision (serve), counted as the real bucket counts it: the pushed
        batch weight while pending, the update, the end."""
        return Served._make(self.decide(course, kind, worker, clock, pulled, weight))

    def decide(self, course: Course, kind: int, worker: int, clock: int, pulled: int,
               weight: float) -> tuple[Decision, int | None, bool, bool]:
        """`take`'s answer as a plain tuple (serving.decide): what the simulator's loop
        calls."""
        decided = decide(self, course, kind, worker, clock, pulled, weight)
        decision, _, update, ends = decided
        if decision.accumulate:
            self.pending_weight += weight
        if update:
            self.progress += self.pending_weight
            self.pending_weight = 0.0
            self.version += 1
            if ends:
                self.over = True
        return decided


class _Worker:
    """A simulated worker between events: what the simulator keeps of it, in one object (a
    step reads most of it, and 10,000 workers' state is too much for a cache otherwise)."""

    __slots__ = ("index", "host", "batch", "weight", "draws", "log", "pulled", "taken", "clock",
                 "computed", "awaiting", "replied", "stopping", "left")

    def __init__(self, index: int, host: int, batch: int, weight: float, draws, log: WorkerLog,
                 pulled: list[int]) -> None:
        self.index, self.host, self.batch, self.weight = index, host, batch, weight
        self.draws, self.log = draws, log  # its compute seconds, and its account
        self.pulled = pulled  # the version of each bucket it last pulled
        self.taken = self.clock = 0  # steps taken in this simulation, and pushes made
        self.computed = self.replied = 0.0  # when its step's compute ended, its latest reply
        self.awaiting = 0  # replies it still waits for
        self.stopping = False  # a reply said training is over
        # Gone: it told the servers it is done. Kept here, not read from its log's end,
        # which a Strategy-Switch's first phase has set already.
        self.left = False


class _ParameterServers:
    def __init__(self, setup: Setup, make_policy, settings, net: Network | None,
                 logs: list[WorkerLog] | None, done: int) -> None:
        self.setup = setup
        n, buckets = setup.workers, setup.buckets
        self.net = net or setup.network()
        self.buckets = [SimulatedBucket(make_policy(), done) for _ in buckets]
        self.course = Course(setup.iterations, setup.shared_epochs)
        # With shared epochs a worker takes steps until the servers end the run.
        self.steps = math.inf if setup.shared_epochs else setup.iterations
        total = max(1, sum(setup.values))
        costs = setup.costs
        self.update_s = [costs.update_s * size / total for size in setup.values]
        # Adding a pushed gradient, after decoding it where it came compressed.
        self.reduce_s = [(costs.reduce_s + setup.codecs.server) * size / total
                         for size in setup.values]
        self.server_host = [setup.host[s] for s in range(setup.servers)]
        self.busy = [0.0] * setup.servers  # when each server is next free
        self.busy_s = [0.0] * setup.servers
        # Each step's kind of message (GRADIENT, REPLY, both or neither), as the real
        # cadence answers it, over its cycle.
        cadence = PushFetch(settings.get("push_every", 1), settings.get("fetch_every", 1))
        self.kinds = [(GRADIENT if push else 0) | (REPLY if fetch else 0)
                      for push, fetch in cadence.cycle()]
        self.encode_s = setup.codecs.push
        self.logs = logs or [WorkerLog(setup.warmup) for _ in range(n)]
        # Each worker's compute seconds are drawn a run's worth at a time: one worker's
        # generator after another's, the way a cache likes it, rather than one per event.
        chunk = max(1, setup.iterations)
        self.workers = [_Worker(w, setup.worker_host(w), setup.batch[w], weight,
                                drawn(setup.compute[w], chunk), self.logs[w], [done] * len(buckets))
                        for w, weight in enumerate(setup.weights)]
        self.staleness: defaultdict[int, int] = defaultdict(int)
        self.count = len(buckets)
        self.bucket_server = [server for server, _ in buckets]
        self.bucket_host = [self.server_host[server] for server in self.bucket_server]
        self.bucket_size = [size for _, size in buckets]
        self.reply_size = setup.replies
        self.message_s = costs.message_s
        self.agenda = Agenda()

    def run(self, name: str, start: list[float] | None) -> SimResult:
        for worker in self.workers:
            self._begin(start[worker.index] if start else 0.0, worker)
        self._play()
        s = self.setup
        return SimResult(name, s.workers, s.servers, self.logs,
                         max(log.end for log in self.logs), Counter(self.staleness), self.net.sent,
                         self.net.received, self.busy_s,
                         max((b.version for b in self.buckets), default=0))

    def _play(self) -> None:
        """Act on every event in time order. The simulator's hottest path (a million pushes
        in seconds): everything it reads bound to a local first, and the usual push's events
        acted on here rather than in methods: the message at its server, and the step's
        compute ending (its last bucket pushed)."""
        add, begin, send, send_together = (self.agenda.add, self._begin, self.net.send,
                                           self.net.send_together)
        out_free, buckets, course, decide = (self.net.out_free, self.buckets, self.course,
                                             [b.decide for b in self.buckets])
        workers, counts, message_s = self.workers, self.staleness, self.message_s
        reduce_s, update_s, busy, busy_s = self.reduce_s, self.update_s, self.busy, self.busy_s
        bucket_server, server_host, reply_size = (self.bucket_server, self.server_host,
                                                  self.reply_size)
        last, last_host, last_size = (self.count - 1, self.bucket_host[-1],
                                      self.bucket_size[-1])
        reply = self._reply
        for t, kind, worker, k, flags in self.agenda:
            if kind == MESSAGE:
                decision, staleness, update, _ = decide[k](
                    course, flags & KIND, worker.index, flags >> CLOCK_SHIFT, worker.pulled[k],
                    worker.weight)
                cost = message_s  # taking the message in
                if staleness is not None:  # a gradient accumulated
                    counts[staleness] += 1
                    cost += reduce_s[k]
                if update:
                    cost += update_s[k]
                release = decision.release
                if release and (len(release) > 1 or workers[release[0]].left):
                    release = [r for r in release if not workers[r].left]  # not gone yet
                server = bucket_server[k]
                cost += message_s * len(release)  # each reply
                free = busy[server]
                done = busy[server] = (t if t > free else free) + cost
                busy_s[server] += cost
                host = server_host[server]
                if release:
                    version, over = buckets[k].version, buckets[k].over
                    if len(release) == 1:
                        to = workers[release[0]]
                        reply(to, k, send(done, host, to.host, reply_size[k]), version, over)
                    else:  # a round's replies, sent at once: they share the server's link
                        to = [workers[r] for r in release]
                        arrivals = send_together(done, host, [(w.host, reply_size[k])
                                                              for w in to])
                        for w, arrives in zip(to, arrivals, strict=True):
                            reply(w, k, arrives, version, over)
                # The server's loop waits for its replies to be sent before it takes the
                # next push (runtime/server/server.py _answer).
                if out_free[host] > busy[server]:
                    busy[server] = out_free[host]
            elif kind == READY:
                self._push(t, worker, k, flags)
            elif flags & GRADIENT:  # computed: the last bucket (the others went in backward)
                add((send(t + message_s, worker.host, last_host, last_size), MESSAGE, worker,
                     last, flags))
                if not flags & REPLY:  # Downpour between fetches: on once the push is out
                    begin(max(t, out_free[worker.host]), worker)
            else:  # computed, without a push
                self._computed_alone(t, worker, flags)

    def _reply(self, worker: _Worker, k: int, arrives: float, version: int, over: bool) -> None:
        """Bucket k's reply reaches the worker: at the `version` it was sent with, and telling
        it whether training is `over`."""
        worker.pulled[k] = version
        if arrives > worker.replied:
            worker.replied = arrives
        if over:
            worker.stopping = True
        worker.awaiting -= 1
        if not worker.awaiting:  # the last bucket goes when compute ends: its reply after
            worker.log.wait_s += worker.replied - worker.computed
            self._begin(worker.replied, worker)

    def _begin(self, t: float, worker: _Worker) -> None:
        """The worker is free at t: it leaves, or computes a step, whose buckets are ready
        through backward (the last when the step's compute ends)."""
        log = worker.log
        if worker.stopping or log.steps >= self.steps:
            self._leave(t, worker)
            return
        seconds = next(worker.draws)
        log.begin_step(t, worker.batch)  # first: it zeroes the warm-up's figures
        log.compute_s += seconds
        kind = self.kinds[worker.taken % len(self.kinds)]
        worker.taken += 1
        if kind & GRADIENT:
            worker.clock += 1
            if self.encode_s:  # encoding its pushes (and decoding the replies)
                log.compress_s += self.encode_s
                seconds += self.encode_s
        flags = kind | worker.clock << CLOCK_SHIFT
        end = worker.computed = t + seconds
        count = self.count
        if kind & REPLY:  # before any push goes: a reply may come before the compute ends
            worker.awaiting, worker.replied = count, end
        if kind & GRADIENT and count > 1:
            for k in range(count - 1):
                self.agenda.add((t + seconds * (1 + 2 * (k + 1) / count) / 3, READY, worker, k,
                                 flags))
        self.agenda.add((end, COMPUTED, worker, 0, flags))

    def _computed_alone(self, t: float, worker: _Worker, flags: int) -> None:
        """A step without a push ended: it fetches (every bucket), or goes on."""
        if flags & REPLY:
            for k in range(self.count):
                self._push(t, worker, k, flags)
        else:
            self._begin(max(t, self.net.out_free[worker.host]), worker)

    def _push(self, t: float, worker: _Worker, k: int, flags: int) -> None:
        arrives = self.net.send(t + self.message_s, worker.host, self.bucket_host[k],
                                self.bucket_size[k] if flags & GRADIENT else HEADER)
        self.agenda.add((arrives, MESSAGE, worker, k, flags))

    def _leave(self, t: float, worker: _Worker) -> None:
        """The worker is done: it tells every bucket's server (the real worker's DONE)."""
        worker.log.end, worker.left = t, True
        for k, host in enumerate(self.bucket_host):
            arrives = self.net.send(t, worker.host, host, HEADER)
            self.agenda.add((arrives, MESSAGE, worker, k, DONE))  # clock 0, as the real one's
