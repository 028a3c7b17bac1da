"""What the local launcher's ranks tell it as they run (a failure's kind and line, progress
for the board): each rank writes into a pipe of its own, which only it writes and only the
launcher reads.

A pipe each and no lock, because a rank may be killed at any instant. The ranks once shared
one multiprocessing.Queue, whose writers take a lock in turn: a rank killed (SIGKILL) while
its queue's thread held it, writing an event, kept it for ever. Every other rank's events
then stopped at that lock, and each survivor waited for ever at its exit for its events to be
written, so a run going on without the lost worker never ended. A rank killed in the middle
of an event now leaves at most part of one message in its own pipe: the launcher holds no
writing end once the ranks have started, so it reads that pipe's end there, and stops
reading that rank.
"""

from __future__ import annotations

import contextlib
from multiprocessing.connection import Connection


class RankEvents:
    """One pipe per rank, from the rank to the launcher. `senders[rank]` goes to the rank as
    it is started (`start`); the launcher `take`s what came in."""

    def __init__(self, ctx, ranks: int) -> None:
        pipes = [ctx.Pipe(duplex=False) for _ in range(ranks)]
        self._readers: list[Connection] = [reader for reader, _ in pipes]
        self.senders: list[Connection] = [sender for _, sender in pipes]

    def start(self, procs: list) -> None:
        """Start the ranks' processes (each given its sender), then let go of the writing
        ends here: a rank's pipe then ends when that rank does, even mid-message."""
        for p in procs:
            p.start()
        for sender in self.senders:
            sender.close()

    def take(self) -> list[dict]:
        """The events in so far, each rank's in the order it sent them; waits for none. A
        pipe whose rank has ended (and was read to its end) is read no more."""
        events = []
        for reader in list(self._readers):
            try:
                while reader.poll():
                    events.append(reader.recv())
            except (EOFError, OSError):  # its rank ended: after its last event, or mid-way
                self._readers.remove(reader)
                reader.close()
        return events

    def close(self) -> None:
        for end in self._readers + self.senders:
            end.close()
        self._readers = []


def send(sender: Connection, event: dict) -> None:
    """Tell the launcher `event` (a rank's side): in the pipe once this returns, so a rank
    that exits next has nothing left to flush. It waits only on a full pipe: 64 KiB, over
    500 progress events (121 bytes each; a worker sends about 4 a second), which the
    launcher empties every 0.2 s. A launcher gone reads nothing (its rank then leaves on its own:
    launch/launchers/local.py's bind_to_launcher)."""
    with contextlib.suppress(OSError):
        sender.send(event)
