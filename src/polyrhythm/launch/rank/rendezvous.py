"""How a torchrun-style rank (polyrhythm.node; a script's `polyrhythm.init()` under torchrun)
joins its job's process group: through the job's store behind rank 0's gate
(launch/rank/gate.py) when the job has a secret, else through torchrun's store (or rank 0's
at the master address) as torch's env:// rendezvous would, with the store's waits bounded
by group.join_wait.

With a secret, rank 0 holds the job's TCPStore on loopback (torch's server binds every
interface unless handed a socket bound already) and its gate on the job's address:
`MASTER_ADDR:MASTER_PORT` where rank 0 hosts the store itself (Spark's tasks, which give
rank 0's own address); under torchrun, whose agent holds a store of its own at that
address, the address Gloo uses (GLOO_SOCKET_IFNAME's, else the master address where it is
this host's, else the host name's) on a free port, which it publishes in torchrun's store
for the others. Every other rank's store client goes through a relay on its own loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys
from datetime import timedelta

import torch.distributed as dist

from polyrhythm.comm import group
from polyrhythm.errors import ConfigError
from polyrhythm.launch.rank.gate import (
    LOOPBACK,
    SECRET_FILE_VARIABLE,
    Gate,
    Relay,
    job_secret,
    listen,
)

GATE_KEY = "polyrhythm/gate"  # in torchrun's store: where rank 0's gate listens
SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address
# The gate and relay of this process: they serve the store as long as the process lives.
_OPEN: list = []


def join_group(rank: int, world: int, timeout: timedelta) -> None:
    """Join the job's Gloo process group as `rank` of `world` (module docstring); the store
    waits group.join_wait for the others to join, Gloo's own waits `timeout`."""
    secret = job_secret()
    wait = timedelta(seconds=group.join_wait(timeout.total_seconds()))
    if secret is None:
        if rank == 0:
            print(f"polyrhythm: warning: no {SECRET_FILE_VARIABLE}: the job's store (torchrun's, "
                  f"at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}) admits "
                  "anyone who reaches it", file=sys.stderr, flush=True)
        group.join(rank, world, timeout.total_seconds(), store=_open_store(rank, world, wait))
        return
    group.join(rank, world, timeout.total_seconds(),
               store=gated_store(secret, rank, world, wait))


def _master() -> tuple[str, int]:
    try:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise ConfigError("MASTER_ADDR and MASTER_PORT are not set: start the job with "
                          "torchrun or polyrhythm's launchers") from None


def _under_torchrun() -> bool:
    """Whether torchrun's agent holds a store at the master address (torch's own test)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def gated_store(secret: bytes, rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The job's store, as `rank` sees it: rank 0's, on loopback behind its gate; another
    rank's, a client through its relay."""
    master = _master()
    if rank == 0:
        listener = listen((LOOPBACK, 0))
        port = listener.getsockname()[1]
        fd = listener.detach()  # the store's from now on
        try:
            store = dist.TCPStore(LOOPBACK, port, world, True, timeout, wait_for_workers=False,
                                  master_listen_fd=fd)
        except BaseException:
            os.close(fd)
            raise
        where = (job_address(master[0]), 0) if _under_torchrun() else master
        try:
            gate = Gate(secret, where, store.port)
        except OSError as exc:
            raise ConfigError(f"rank 0 cannot listen on {where[0]}:{where[1]} for the job's "
                              f"store ({exc.strerror or exc})") from None
        _OPEN.append(gate)
        if _under_torchrun():
            _torchrun_store(master, timeout).set(GATE_KEY, f"{gate.address[0]} "
                                                           f"{gate.address[1]}")
        return store
    if _under_torchrun():
        host, port = _torchrun_store(master, timeout).get(GATE_KEY).decode().split()
        master = (host, int(port))
    relay = Relay(secret, master, timeout.total_seconds())
    _OPEN.append(relay)
    return dist.TCPStore(LOOPBACK, relay.port, world, False, timeout)


def _torchrun_store(master: tuple[str, int], timeout: timedelta) -> dist.Store:
    return dist.TCPStore(master[0], master[1], None, False, timeout)


def _open_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The job's store at the master address, with no gate: torchrun's agent's, else rank
    0's (as torch's env:// makes them, but waiting `timeout`, not --timeout)."""
    master = _master()
    if _under_torchrun():
        return _torchrun_store(master, timeout)
    return dist.TCPStore(master[0], master[1], world, rank == 0, timeout)


def job_address(master: str) -> str:
    """The address this host's ranks use on the job's network: GLOO_SOCKET_IFNAME's (the
    first it names), else `master` where it is this host's, else the host name's."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if interface:
        return interface_address(interface)
    if is_here(master):
        return master
    return socket.gethostbyname(socket.gethostname())


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name[:15].encode()))
        except OSError as exc:
            raise ConfigError(f"GLOO_SOCKET_IFNAME={name}: no IPv4 address on this host "
                              f"({exc.strerror or exc})") from None
    return socket.inet_ntoa(packed[20:24])


def is_here(host: str) -> bool:
    """Whether `host` is an address of this host (a socket can be bound to it)."""
    try:
        with contextlib.closing(listen((host, 0))):
            return True
    except OSError:
        return False
