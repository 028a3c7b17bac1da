"""A peer that is gone or silent, told apart from every other error on the wire.

Gloo (torch 2.13, CPU) raises a plain RuntimeError for everything, told apart only by its
words (measured with two processes):

- a peer whose process died, during a receive, a send or a collective: "Connection closed by
  peer [127.0.0.1]:PORT" (or "Read error ...: Connection reset by peer");
- a wait that passed the process group's timeout: "Timed out waiting 3000ms for recv
  operation to complete" (a peer stopped, or hanging, or cut off), and on the connection
  that wait closed, "Application timeout caused pair closure";
- a misuse, such as a buffer that is not contiguous: its own words ("input tensor has to be
  contiguous").

A size mismatch raises nothing: a message longer than the receive's buffer aborts the
receiving process in Gloo's own thread (SIGABRT, "Received data size doesn't match expected
size" on its stderr, which no Python code can catch), and a shorter one is taken silently.

So the transport is the one place that reads Gloo's words: `translated` turns a closed
connection into PeerLost and a timeout into PeerSilent, and leaves every other error as it
was, type and traceback, for the layers above, which go by type.
"""

from __future__ import annotations

from polyrhythm.errors import one_line

# Gloo's words for a connection that broke (tcp/pair.cc) and for a wait past the timeout
# (tcp/unbound_buffer.cc, for receives and sends alike).
_CLOSED = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
           "Read error", "Write error")
_TIMED_OUT = ("Timed out waiting",
              # a pair Gloo closed when a wait on it timed out, met by the next operation
              "Application timeout caused pair closure")


class PeerFault(Exception):
    """A peer of this rank stopped taking part: gone (PeerLost) or silent (PeerSilent).
    `rank` is the peer's, None where a collective cannot tell which member it was."""

    what = "failed"

    def __init__(self, rank: int | None, cause: BaseException) -> None:
        why = one_line(cause) or repr(cause)
        super().__init__(f"{f'rank {rank}' if rank is not None else 'a peer'} {self.what}: "
                         f"{why}")
        self.rank = rank


class PeerLost(PeerFault):
    """A peer's connection broke (its process died) while this one talked to it."""

    what = "is gone"


class PeerSilent(PeerFault):
    """A peer sent nothing within the process group's timeout (stopped, or hanging)."""

    what = "sent nothing within the timeout"


def translated(exc: BaseException, peer: int | None = None) -> BaseException:
    """What `exc`, raised by torch.distributed while talking to `peer`, means: PeerLost for a
    broken connection, PeerSilent for a timeout (each caused by `exc`), or `exc` itself."""
    if isinstance(exc, PeerFault) or not isinstance(exc, RuntimeError):
        return exc
    text = str(exc)
    kind = (PeerLost if any(words in text for words in _CLOSED)
            else PeerSilent if any(words in text for words in _TIMED_OUT) else None)
    if kind is None:
        return exc
    ours = kind(peer, exc)
    ours.__cause__ = exc
    return ours


class on_the_wire:  # noqa: N801 (used as a function: `with on_the_wire(peer):`)
    """Raise what happens in the block as `translated` says (talking to `peer`). A class,
    not a generator-based context manager: every message enters one, twice (posted, waited
    on), so it costs no generator where nothing goes wrong."""

    __slots__ = ("peer",)

    def __init__(self, peer: int | None = None) -> None:
        self.peer = peer

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, trace) -> bool:
        if isinstance(exc, RuntimeError):
            ours = translated(exc, self.peer)
            if ours is not exc:
                raise ours from exc
        return False
