"""The gate in front of a job's store: a peer proves the run's secret before it reaches it.

torch's TCPStore authenticates nobody, and its server listens on every interface whatever
address it is given: whoever reaches its port can read the ranks' addresses, write keys, or
join the job's rendezvous. So rank 0 keeps the job's store on loopback, and listens on the
job's own address with a Gate. Each connection must first prove that it holds the run's
secret (HMAC-SHA256 over a fresh nonce from each side, so a proof cannot be replayed; the
gate proves it back, so a rank never hands its store traffic to an impostor). A connection
that proves it is spliced to the store; one that proves wrong, or nothing within
HANDSHAKE_S, is closed with a line in rank 0's log naming its address, and the job goes on.
Every other rank reaches the store through a Relay: a listener on its own loopback, which
its TCPStore client connects to, carrying each connection through the gate.

Standard library only (no torch): launch/rank/rendezvous.py puts the store behind it.

The protocol, every field of fixed length:
    gate -> peer:  GREETING, nonce_g (NONCE bytes)
    peer -> gate:  nonce_p (NONCE bytes), HMAC(secret, b"peer" + nonce_g + nonce_p)
    gate -> peer:  HMAC(secret, b"gate" + nonce_p + nonce_g)
then the connection is the store's.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from polyrhythm.errors import ConfigError

# The run's secret: made by the launcher that starts the ranks (Spark's driver, the emulated
# cluster's launcher) and given in their environment; or, for a user's own torchrun, a file
# only its owner can read, the same on every host.
SECRET_VARIABLE = "POLYRHYTHM_SECRET"
SECRET_FILE_VARIABLE = "POLYRHYTHM_SECRET_FILE"
GREETING = b"polyrhythm-gate/1\n"  # says what answered: a peer that finds else says so
NONCE = 32
PROOF = hashlib.sha256().digest_size
HANDSHAKE_S = 10.0  # a rank answers in milliseconds; a stranger holds a thread no longer
# Between a relay's tries to reach a gate not yet listening: 5 ms first (rank 0 is usually
# about to listen), doubling up to 0.2 s, so that a rank waits little past rank 0's start.
FIRST_RETRY_S, LAST_RETRY_S = 0.005, 0.2
BUFFER = 1 << 16
LOOPBACK = "127.0.0.1"

Say = Callable[[str], None]


def new_secret() -> str:
    """A fresh secret for one run: 32 random bytes, as text for an environment variable."""
    return secrets.token_hex(32)


def job_secret() -> bytes | None:
    """The run's secret, from POLYRHYTHM_SECRET_FILE's file or POLYRHYTHM_SECRET (taken out
    of this process's environment, so that the processes it starts do not inherit it);
    None where the job was given none."""
    path = os.environ.get(SECRET_FILE_VARIABLE)
    given = os.environ.pop(SECRET_VARIABLE, None)
    if path:
        return secret_file(Path(path))
    return given.encode() if given else None


def secret_file(path: Path) -> bytes:
    """The secret in `path`, which only its owner may read."""
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{SECRET_FILE_VARIABLE}={path}: cannot read it "
                          f"({exc.strerror or exc})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{SECRET_FILE_VARIABLE}={path}: others may read it (mode "
                          f"{stat.S_IMODE(mode):04o}): chmod 600 it")
    if not secret:
        raise ConfigError(f"{SECRET_FILE_VARIABLE}={path}: the file is empty")
    return secret


def _proof(secret: bytes, who: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, who + first + second, hashlib.sha256).digest()


def _receive(conn: socket.socket, size: int, deadline: float) -> bytes:
    """Exactly `size` bytes, or TimeoutError at `deadline`, or EOFError if the peer closes."""
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def admit(conn: socket.socket, secret: bytes, within_s: float) -> str | None:
    """The gate's side of the handshake on `conn`: None once the peer has proved the
    secret (and been given the gate's proof), else why not."""
    deadline = time.monotonic() + within_s
    nonce = secrets.token_bytes(NONCE)
    try:
        conn.sendall(GREETING + nonce)
        answer = _receive(conn, NONCE + PROOF, deadline)
        theirs, proof = answer[:NONCE], answer[NONCE:]
        if not hmac.compare_digest(proof, _proof(secret, b"peer", nonce, theirs)):
            return "a wrong proof of the run's secret"
        conn.sendall(_proof(secret, b"gate", theirs, nonce))
    except TimeoutError:
        return f"no proof of the run's secret within {within_s:g} s"
    except (EOFError, OSError):
        return "it closed the connection without proving the run's secret"
    conn.settimeout(None)
    return None


def enter(conn: socket.socket, secret: bytes, within_s: float) -> str | None:
    """A peer's side of the handshake on `conn`, connected to a gate: None once each side
    has proved the secret to the other, else why not."""
    deadline = time.monotonic() + within_s
    try:
        greeting = _receive(conn, len(GREETING) + NONCE, deadline)
        if not greeting.startswith(GREETING):
            return "it is not polyrhythm's gate (another program, or a rank 0 without one)"
        theirs, nonce = greeting[len(GREETING):], secrets.token_bytes(NONCE)
        conn.sendall(nonce + _proof(secret, b"peer", theirs, nonce))
        proof = _receive(conn, PROOF, deadline)
    except TimeoutError:
        return f"it did not answer within {within_s:g} s"
    except (EOFError, OSError):
        return "it refused this rank's proof of the run's secret (is every rank given the same?)"
    if not hmac.compare_digest(proof, _proof(secret, b"gate", nonce, theirs)):
        return "it gave a wrong proof of the run's secret: it is not this job's rank 0"
    conn.settimeout(None)
    return None


def splice(one: socket.socket, other: socket.socket) -> None:
    """Carry bytes both ways between two connections until either ends; then close both."""
    back = threading.Thread(target=_pump, args=(other, one), daemon=True, name="gate-pump")
    back.start()
    _pump(one, other)
    back.join()
    one.close()
    other.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(BUFFER):
            sink.sendall(data)
    for end in (source, sink):  # wakes the other direction's receive: it ends too
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


def _quick(conn: socket.socket) -> socket.socket:
    """A store's requests and answers are small: sent at once, not held for Nagle."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def listen(address: tuple[str, int]) -> socket.socket:
    """A socket listening on `address` (host, port; port 0: any free one) only."""
    family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)[0][0]
    return socket.create_server(address, family=family, backlog=128)


def accepting(listener: socket.socket,
              handle: Callable[[socket.socket, tuple[str, int]], None]) -> None:
    """Hand each connection `listener` accepts, with its peer's (host, port), to `handle`
    in a thread of its own (a peer's handshake holds up no other), until it is closed."""
    while True:
        try:
            conn, peer = listener.accept()
        except OSError:  # closed
            return
        threading.Thread(target=handle, args=(_quick(conn), peer[:2]), daemon=True,
                         name="gate-connection").start()


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Gate:
    """A listener on `address` in front of the store on loopback port `store_port`: each
    connection is spliced to the store once it has proved `secret`, else closed with a line
    through `say` naming the peer (`refused` keeps them, for whoever asks)."""

    def __init__(self, secret: bytes, address: tuple[str, int], store_port: int,
                 handshake_s: float = HANDSHAKE_S, say: Say = say_on_stderr) -> None:
        self.secret, self.store_port, self.handshake_s, self.say = (
            secret, store_port, handshake_s, say)
        self.listener = listen(address)
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.refused: list[tuple[str, int]] = []
        threading.Thread(target=accepting, args=(self.listener, self._admit), daemon=True,
                         name="gate").start()

    def _admit(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        why = admit(conn, self.secret, self.handshake_s)
        if why is not None:
            self.refused.append(peer)
            self.say(f"polyrhythm: refused a connection from {peer[0]}:{peer[1]} to the "
                     f"job's store: {why}; the run goes on")
            conn.close()
            return
        try:
            store = _quick(socket.create_connection((LOOPBACK, self.store_port)))
        except OSError:  # the store has ended: the job is over
            conn.close()
            return
        splice(conn, store)

    def close(self) -> None:
        self.listener.close()


class Relay:
    """A listener on this host's loopback that carries each connection to the gate at
    `gate` (host, port), proving `secret` there and checking the gate's proof. Made once
    the gate has admitted a first connection (tried until `timeout_s`: rank 0 may not
    listen yet), so that a secret that does not match, or a gate that never answers, is
    one line (ConfigError) here rather than a store that fails later."""

    def __init__(self, secret: bytes, gate: tuple[str, int], timeout_s: float,
                 handshake_s: float = HANDSHAKE_S) -> None:
        self.secret, self.gate, self.timeout_s, self.handshake_s = (
            secret, gate, timeout_s, handshake_s)
        self.tunnel().close()
        self.listener = listen((LOOPBACK, 0))
        self.port: int = self.listener.getsockname()[1]
        threading.Thread(target=accepting, args=(self.listener, self._carry), daemon=True,
                         name="relay").start()

    def tunnel(self) -> socket.socket:
        """A connection through the gate, both sides' proofs given."""
        deadline = time.monotonic() + self.timeout_s
        where = f"{self.gate[0]}:{self.gate[1]}"
        pause = FIRST_RETRY_S
        while True:
            try:
                conn = _quick(socket.create_connection(
                    self.gate, timeout=max(0.1, deadline - time.monotonic())))
            except OSError as exc:  # not listening yet, or unreachable
                if time.monotonic() + pause >= deadline:
                    raise ConfigError(f"the job's store at {where} did not answer within "
                                      f"{self.timeout_s:g} s ({exc.strerror or exc}): is rank "
                                      "0 running, and can this host reach it?") from None
                time.sleep(pause)
                pause = min(2 * pause, LAST_RETRY_S)
                continue
            why = enter(conn, self.secret, self.handshake_s)
            if why is None:
                return conn
            conn.close()
            raise ConfigError(f"the job's store at {where}: {why}")

    def _carry(self, local: socket.socket, _: tuple[str, int]) -> None:
        try:
            remote = self.tunnel()
        except ConfigError as exc:  # the store's client sees its connection end
            say_on_stderr(f"polyrhythm: {exc}")
            local.close()
            return
        splice(local, remote)

    def close(self) -> None:
        self.listener.close()
