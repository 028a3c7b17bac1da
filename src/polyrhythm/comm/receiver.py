"""Messages of a fixed size from known ranks, in arrival order (a server's pushes, gossip), and
the one message whichever of several ranks sends first (a Strategy-Switch's handover)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from polyrhythm.comm.faults import PeerFault, PeerSilent, translated
from polyrhythm.comm.posting import post_receive
from polyrhythm.comm.waiting import NEVER, gone, watch

if TYPE_CHECKING:
    from polyrhythm.comm.transport import Transport

POLL_S = 0.05  # how often a Receiver with nothing to hand out looks for a silent source


class Receiver:
    """Messages of a fixed size from known ranks in arrival order, like a receive from any
    rank, but with each rank's receive posted ahead of time by a thread of its own.

    Gloo's receive-from-any costs an extra round trip per message (the receiver must first ask
    the sender); a receive posted for a known rank lets the data flow at once. Each thread
    waits on its rank's posted receive (the wait releases the GIL) and queues the message.
    Two ways to go on:

    - without `last` (a server's pushes): one buffer per rank, whose next receive is posted
      once the caller has used it (`release`); a rank's last message is the one released
      with `more=False`;
    - with `last` (gossip): a fresh buffer per message and the next receive posted at once,
      so a sender never waits for this process's loop to get round to its previous message
      (two workers waiting for each other's loops would deadlock); a rank's last message is
      the one `last(message)` is true of.

    Bytes are counted when the caller takes a message, on one thread. A source whose
    connection broke or that fell silent makes `take()` raise PeerLost or PeerSilent, once;
    any other error of a receive (a bug) is raised by `take()` as it is, with its traceback.
    Silence is told by this receiver's own clock (a receive posted that long ago and not
    complete), not by Gloo's timeout, which would close every connection of the process
    (Pending.wait): a caller may go on without a source fallen silent (cut off) or gone,
    whose later messages, if any, are dropped. A broken connection is told by the source's
    receive failing, or by the watch on the source (comm/waiting.py) where Gloo leaves that
    receive waiting for ever (its message cut short).
    """

    def __init__(self, transport: Transport, sources: list[int], numel: int, tag: int = 0, *,
                 last: Callable[[torch.Tensor], bool] | None = None) -> None:
        self.transport, self.numel, self.tag, self.last = transport, numel, tag, last
        self._arrived: queue.SimpleQueue[tuple[int, torch.Tensor] | Exception] = (
            queue.SimpleQueue())
        self._go_on = {s: queue.SimpleQueue() for s in sources} if last is None else {}
        self._posted: dict[int, float | None] = dict.fromkeys(sources)  # when, if waiting
        self._dropped: set[int] = set()  # sources fallen silent
        self._looked = time.monotonic()  # when lost or silent sources were last looked for
        for src in sources:
            if self.transport.timeout is not None:  # one that may go on without a source
                watch(src)
            threading.Thread(target=self._receive, args=(src,), daemon=True,
                             name=f"recv-from-{src}").start()

    def _receive(self, src: int) -> None:
        buffer = torch.empty(self.numel)
        silence = self.transport.timeout
        try:
            while True:
                self._posted[src] = time.monotonic()
                work = post_receive(buffer, src, self.tag)  # counted in take(), one thread
                if silence is None:
                    work.wait()
                else:
                    work.wait(NEVER)
                self._posted[src] = None
                self._arrived.put((src, buffer))
                if self.last is None:
                    if not self._go_on[src].get():  # released, with more to come or not
                        return
                elif self.last(buffer):
                    return
                else:
                    buffer = torch.empty(self.numel)
        except Exception as exc:  # the caller's next take() raises it, in its own thread
            self._arrived.put(translated(exc, src))

    def take(self, block: bool = True) -> tuple[int, torch.Tensor] | None:
        """The next message as (rank, buffer); None if none is in and not `block`. Raises
        what ended a source's receives: PeerLost, PeerSilent, or a bug's own error."""
        while True:
            if time.monotonic() - self._looked > POLL_S:  # busy with the others' messages too
                self._raise_lost_or_silent()
            try:
                item = self._arrived.get(block=block, timeout=POLL_S if block else None)
            except queue.Empty:
                if not block:
                    return None
                continue
            if getattr(item, "rank", None) in self._dropped or (
                    isinstance(item, tuple) and item[0] in self._dropped):
                continue  # from a source this receiver went on without
            if isinstance(item, Exception):
                if isinstance(item, PeerFault):  # said once: its receive is over
                    self._dropped.add(item.rank)
                raise item
            self.transport.count_received(item[1])
            return item

    def _raise_lost_or_silent(self) -> None:
        """For a source waited on (its receive posted, no message of it waiting to be
        taken): PeerLost if its connection broke though the receive goes on waiting, or
        PeerSilent if the receive was posted longer than the timeout ago. Either drops it."""
        silence, now = self.transport.timeout, time.monotonic()
        self._looked = now
        if silence is None:
            return
        for src, posted in list(self._posted.items()):
            if posted is None or src in self._dropped:
                continue
            fault = gone(src)
            if fault is None and now - posted > silence:
                fault = PeerSilent(src, TimeoutError(f"Timed out waiting {silence:g} s for a "
                                                     "message"))
            if fault is not None:
                self._dropped.add(src)
                raise fault

    def waiting(self) -> int:
        """Messages arrived and not yet taken: a server's queue."""
        return self._arrived.qsize()

    def release(self, src: int, more: bool = True) -> None:
        """(Without `last`.) The buffer of `src` is free again; post its next receive unless
        it sends no more."""
        self._go_on[src].put(more)


def first_message(transport: Transport, tensor: torch.Tensor, sources: list[int], tag: int,
                  within: float | None) -> int:
    """Receive into `tensor` the message whichever of `sources` sends first, within `within`
    seconds (None: no bound); its rank. The others are never expected to send: their
    receives stay posted, each waited for by a thread of its own that nobody asks again.
    PeerLost (or what else failed) if every source is gone first, PeerSilent if none sends
    in time."""
    arrived: queue.SimpleQueue = queue.SimpleQueue()

    def receive(src: int, box: torch.Tensor) -> None:
        try:
            post_receive(box, src, tag).wait(NEVER)
            arrived.put((src, box, None))
        except Exception as exc:  # noqa: BLE001 - told to the caller, in its thread
            arrived.put((src, None, translated(exc, src)))

    for src in sources:
        threading.Thread(target=receive, args=(src, torch.empty_like(tensor)), daemon=True,
                         name=f"first-from-{src}").start()
    deadline = None if within is None else time.monotonic() + within
    failed: list[BaseException] = []
    while len(failed) < len(sources):
        try:
            src, box, fault = arrived.get(
                timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise PeerSilent(None, TimeoutError(f"no message within {within:g} s")) from None
        if fault is None:
            tensor.copy_(box)
            transport.count_received(tensor)
            return src
        failed.append(fault)
    raise failed[0]
