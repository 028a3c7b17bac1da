"""The workers of a job whose members may change (on_worker_failure = continue under a
strategy whose workers regroup): who they are now, in generations, and what they do together
(an all-reduce over them all, an exchange with some: D-PSGD's ring), going on without a
worker lost mid-step.

Why no Gloo group (measured on torch 2.13's Gloo, 5 processes): a rank killed mid-all-reduce
fails Gloo's collective at once only for its two neighbours in the ring; the others wait out
the group's timeout, which then closes every connection they have. A new Gloo group over the
survivors stalls its first barrier-like call until the abandoned group's stuck collective
times out (abort and shutdown do not release it; Gloo cannot shrink a group). Messages
posted point to point on the job's default group, and left behind, hold nothing up.

So a generation's all-reduce is one of comm/collectives.py's schedules, its rounds tagged
for the generation (an exchange, its messages), every message waited for on a thread of the
generation's own (a wait of an abandoned generation is left to it), while the caller watches
the generation's alarm:

- each member posts, as a generation opens, a greeting receive from every other member.
  A member that sees a message of the all-reduce fail (its peer's connection broke) or a
  peer stay silent past the timeout greets every other member. A greeting arriving, or a
  greeting receive failing (Gloo fails it the moment that member's connection breaks, on
  every survivor alike), ends every wait of the generation at once: nobody waits out a
  timeout for a peer that is not its neighbour in the ring;
- the greetings carry how many operations each member completed, and the members greeted,
  with the member itself, are the next generation, which goes on from the operation the
  furthest are in. For an all-reduce counts differ by one at most (nobody completes one
  without everybody's part of it): a member that completed the one interrupted hands its
  result to those that did not, so every survivor goes on from the same step, bit for bit;
  where none did, each redoes it over the survivors from its own input (a fresh buffer: a
  message of the abandoned generation may still land in the old). An exchange needs only
  its neighbours' part, so a member may be further behind; it has no result to hand: a
  member the others went on past goes on past the exchanges they are beyond, without what
  it would have received, and where none completed it, all redo it over the members left;
- a lost member's share of a sum is missing from then on, as a parameter server leaves it
  out (the survivors keep their weights: strategies/allreduce.py);
- a member done with its last operation (`finish`) has no next one to hear the alarm in: it
  answers greetings as they come, so that those whose last operation a loss cut short
  still get its result rather than wait out the timeout and call it lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from polyrhythm.comm.collectives import TAG_BASE, all_reduce
from polyrhythm.comm.faults import PeerFault, PeerLost, translated
from polyrhythm.comm.messages import MEMBERS
from polyrhythm.comm.posting import post_receive, post_send
from polyrhythm.comm.waiting import NEVER, Waiter

if TYPE_CHECKING:
    from polyrhythm.comm.transport import Pending, Transport

# An exchange's plan: for the members now, what to send to each rank and where to receive
# from each (Membership.exchange).
Plan = Callable[[list[int]], tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]]

GENERATION_TAGS = 2**16  # tags of one generation's all-reduce rounds (a round's tag: + r)
GENERATIONS = 2**14  # the most a job has: tags above them would pass Gloo's int32
EXCHANGE = GENERATION_TAGS - 1  # a generation's exchange's tag (its all-reduce rounds: below)
# Greetings of generation g carry tag MEMBERS + 2g; a result handed over, MEMBERS + 2g + 1.


class MembersChanged(PeerLost):
    """A member of the generation was lost during its all-reduce: regroup, then go on."""


class _Done(threading.Event):
    error: BaseException | None = None
    count = training = 0  # a greeting's
    interrupted = False


class Membership:
    """The workers' members now (global ranks, in order) and their generation, for the
    member `transport.rank`; each wait bounded by `timeout` seconds of silence; fewer
    than `least` members left fail the run (PeerLost)."""

    def __init__(self, transport: Transport, members: list[int], timeout: float,
                 least: int = 1) -> None:
        self.transport, self.rank, self.timeout = transport, transport.rank, timeout
        self.members, self.least = list(members), least
        self.generation = 0
        self.completed = 0  # all-reduces completed
        self.training = 0  # those of the training's own (counted: not bookkeeping)
        # Each change: (the training's all-reduces every member left had completed before
        # it, the ranks lost, time.perf_counter()).
        self.changes: list[tuple[int, list[int], float]] = []
        self._last: torch.Tensor | None = None  # the last all-reduce's result
        self._skipped = 0  # exchanges the others are past, for this member to go on past
        # The messages of attempts abandoned mid-way, kept: a work of Gloo's freed while
        # posted leaves its connection waiting for a buffer that is gone, and every later
        # message on it stalls behind (measured: a regrouped ring all-reduce hung so).
        self._abandoned: list = []
        self._greeted: list = []  # greetings sent: kept, as Gloo's sends must be, till done
        self._lock = threading.Lock()
        # Training done (finish): greetings are answered as they come, but in an operation
        # (BatchNorm statistics' sum after training), which answers them itself.
        self._finished = self._operating = False
        self._answering = threading.Lock()  # an answer, or an operation's start and end
        self._open()

    # --- a generation ---------------------------------------------------------------------

    def _open(self) -> None:
        """Post the generation's greeting receives, each waited for by a thread that raises
        the alarm when it ends, whether it brings a greeting or its peer's connection broke."""
        if self.generation >= GENERATIONS:
            raise PeerLost(None, RuntimeError(f"the workers changed {GENERATIONS} times"))
        with self._lock:  # no earlier generation's greeting thread rings it (_raise_alarm)
            self._alarm = False
            self._in_flight: set[_Done] = set()
        self._waiters: dict[int, Waiter] = {}
        self._greetings: dict[int, _Done] = {}
        for peer in self._others():
            box, done = torch.zeros(2, dtype=torch.float64), _Done()
            self._greetings[peer] = done
            try:
                work = post_receive(box, peer, MEMBERS + 2 * self.generation)
            except RuntimeError as exc:  # its connection broke already
                done.error = exc
                done.set()
                self._raise_alarm()
                continue
            threading.Thread(target=self._await_greeting,
                             args=(work, box, done, self.generation), daemon=True,
                             name=f"greeting-{peer}").start()

    def _others(self) -> list[int]:
        return [m for m in self.members if m != self.rank]

    def _await_greeting(self, work, box: torch.Tensor, done: _Done, generation: int) -> None:
        try:
            work.wait(NEVER)
            done.count, done.training = (int(v) for v in box.tolist())
        except BaseException as exc:
            done.error = exc
        # The alarm first: a member that has read the greeting may open the next generation
        # at once, whose alarm this one must not ring. Rung there, it would end a wait of
        # the next generation for nothing; in the members' last all-reduce, one that a peer
        # has already completed, the member would regroup with nobody left to answer, and
        # each side wait out the timeout before calling the other lost (our reading of a
        # live worker lost under gossip in a fresh clone's make test; not reproduced here).
        self._raise_alarm(generation)
        done.set()
        if self._finished and done.error is None:
            self._answer(generation)

    def _raise_alarm(self, generation: int | None = None) -> None:
        """End every wait of the generation now (`generation`: only if it is still this
        one)."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self._alarm = True
            waits, self._in_flight = self._in_flight, set()
        for done in waits:
            done.interrupted = True
            done.set()

    def _wait(self, pending: Pending) -> None:
        """Wait for one message of the generation's all-reduce: MembersChanged if the alarm
        rings meanwhile, its peer's connection breaks, or it stays silent past the timeout."""
        done = _Done()
        with self._lock:
            if self._alarm:
                raise MembersChanged(pending.peer, RuntimeError("a member was lost"))
            self._in_flight.add(done)
        waiter = self._waiters.get(pending.peer)
        if waiter is None:
            waiter = self._waiters[pending.peer] = Waiter(pending.peer)
        waiter.works.put((pending.work, done))
        ended = done.wait(self.timeout)
        with self._lock:
            self._in_flight.discard(done)
        if done.interrupted:
            raise MembersChanged(pending.peer, RuntimeError("a member was lost"))
        if not ended:
            raise MembersChanged(pending.peer, TimeoutError(
                f"no message from rank {pending.peer} within {self.timeout:g} s"))
        if done.error is not None:
            raise MembersChanged(pending.peer, done.error)
        pending.settle()

    # --- what the members do together -----------------------------------------------------

    def _tags(self) -> int:
        return TAG_BASE + self.generation * GENERATION_TAGS

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """An operation of the members: no greeting is answered on its own thread meanwhile
        (an answer under way ends first, so the operation is in the generation it left);
        once training is done, one that came as it ended is answered after it."""
        with self._answering:
            self._operating = True
        try:
            yield
        finally:
            with self._answering:
                self._operating = False
            with self._lock:
                generation, alarm = self.generation, self._alarm
            if self._finished and alarm:
                self._answer_later(generation)

    def all_reduce(self, tensor: torch.Tensor, algorithm: str) -> None:
        """Sum `tensor` in place over the members, going on without any lost meanwhile."""
        with self._operation():
            self._all_reduce(tensor, algorithm)

    def _all_reduce(self, tensor: torch.Tensor, algorithm: str) -> None:
        while True:
            attempt, posted = tensor.clone(), []
            try:
                all_reduce(self.transport, attempt, self.members, self.rank, algorithm,
                           self._tags(), self._wait, posted)
            except (MembersChanged, PeerFault):
                self._abandoned.append((attempt, posted))
                behind, handed = self._regroup(tensor)
                if not behind:
                    continue  # redone over the survivors
                attempt = handed
            self._done(attempt)
            tensor.copy_(attempt)
            return

    def exchange(self, plan: Plan) -> dict[int, torch.Tensor] | None:
        """One exchange of messages with some members (D-PSGD's with its ring neighbours):
        `plan(members)` says, for the members now, what to send to each (by rank) and the
        buffers to receive into from each, fresh after a change (a message of an abandoned
        generation may still land in the old). The buffers received, once all are in; None
        where the others went on past the exchange without this member (one was lost as
        they completed it): it goes on without what it would have received. Redone over the
        members left where none had completed it."""
        with self._operation():
            return self._exchange(plan)

    def _exchange(self, plan: Plan) -> dict[int, torch.Tensor] | None:
        if self._skipped:  # the others went on past it as well (_agree)
            self._skipped -= 1
            self._done(None)
            return None
        while True:
            sends, receives = plan(self.members)
            tag, pending = self._tags() + EXCHANGE, []
            try:
                for rank, box in receives.items():
                    pending.append(self.transport.irecv(box, rank, tag))
                for rank, data in sends.items():
                    pending.append(self.transport.isend(data, rank, tag))
                for each in pending:
                    self._wait(each)
            except (MembersChanged, PeerFault):
                self._abandoned.append(pending)
                behind, _ = self._regroup(None)
                if not behind:
                    continue
                receives = None
            self._done(None)
            return receives

    def _done(self, result: torch.Tensor | None) -> None:
        """One more operation completed (an all-reduce's `result`, kept to hand over)."""
        self.completed += 1
        self.training += not self.transport.counting_paused
        self._last = result

    def finish(self) -> None:
        """This member's last operation is done. A member interrupted in that operation by a
        loss (one that this member completed) greets it, and would otherwise wait out the
        timeout for it and call it lost: from now on a greeting is answered as it comes, on
        its own thread, as the next operation would have answered it (the members agree,
        and the first of those that completed the operation hands its result over)."""
        self._finished = True
        with self._lock:
            generation, alarm = self.generation, self._alarm
        if alarm:  # a greeting came before this: answer it
            self._answer_later(generation)

    def _answer_later(self, generation: int) -> None:
        threading.Thread(target=self._answer, args=(generation,), daemon=True,
                         name="membership-answer").start()

    def _answer(self, generation: int) -> None:
        with self._answering:
            # Answered already (the members regrouped), or an operation answers it.
            if generation != self.generation or self._operating:
                return
            with contextlib.suppress(PeerLost):  # too few left: the run's end says so
                self._regroup(self._last)

    # --- a change of members --------------------------------------------------------------

    def _regroup(self, template: torch.Tensor | None) -> tuple[bool, torch.Tensor | None]:
        """The members left become the next generation. Whether this member is behind the
        others (they completed the operation it was in), with the result one of them hands
        it where the operation was an all-reduce (`template`: its shape; None: an
        exchange, which has no result to hand)."""
        while True:
            try:
                return self._agree(template)
            except MembersChanged:
                continue  # another member lost while regrouping: again, one generation on

    def _agree(self, template: torch.Tensor | None) -> tuple[bool, torch.Tensor | None]:
        self._raise_alarm()
        tag = MEMBERS + 2 * self.generation
        mine = torch.tensor([self.completed, self.training], dtype=torch.float64)
        for peer in self._others():
            if not self._greetings[peer].is_set() or self._greetings[peer].error is None:
                self._greeted.append(_send_quietly(mine, peer, tag))
        counts, training = {self.rank: self.completed}, [self.training]
        for peer in self._others():
            done = self._greetings[peer]
            if done.wait(self.timeout) and done.error is None:
                counts[peer] = done.count
                training.append(done.training)
        lost = [m for m in self.members if m not in counts]
        ahead = max(counts.values())
        source = min(m for m, c in counts.items() if c == ahead)
        behind = [m for m, c in counts.items() if c < ahead]
        # Everybody goes on from the operation the first members are in. Nobody completes
        # an all-reduce without everybody's part of it, so there counts differ by one at
        # most; an exchange needs only its neighbours', so a member may be further behind,
        # and goes on past the exchanges the others are beyond (exchange).
        self._skipped = max(0, ahead - self.completed - 1)
        self.members = [m for m in self.members if m in counts]
        with self._lock:
            self.generation += 1
        self.changes.append((min(training), lost, time.perf_counter()))
        self._open()
        if len(self.members) < self.least:
            raise _TooFew(lost[0] if lost else None, len(self.members), self.least)
        return self.rank in behind, self._hand_over(template, source, behind, tag + 1)

    def _hand_over(self, template: torch.Tensor | None, source: int, behind: list[int],
                   tag: int) -> torch.Tensor | None:
        """The interrupted all-reduce's result, from the first member that completed it to
        those that did not (an exchange's: nothing)."""
        if self.rank == source and self._last is not None:
            for member in behind:
                self._checked(self.transport.isend(self._last, member, tag))
        elif self.rank in behind and template is not None:
            result = torch.empty_like(template)
            self._checked(self.transport.irecv(result, source, tag))
            return result
        return None

    def _checked(self, pending: Pending) -> None:
        try:
            pending.wait(self.timeout)
        except PeerFault as exc:
            self._abandoned.append(pending)
            raise MembersChanged(pending.peer, exc) from exc


class _TooFew(PeerLost):
    def __init__(self, rank: int | None, left: int, least: int) -> None:
        super().__init__(rank, RuntimeError(f"{left} workers would be left, fewer than "
                                            f"min_workers {least}"))


def _send_quietly(box: torch.Tensor, peer: int, tag: int):
    """A greeting, not waited for (a peer gone or silent never takes it): its work."""
    try:
        return post_send(box, peer, tag)
    except RuntimeError as exc:
        if not isinstance(translated(exc, peer), PeerFault):
            raise
        return None
