"""Rank 0's gate in front of the job's store (launch/rank/gate.py) and the store put behind it
(launch/rank/rendezvous.py): a peer with the run's secret reaches a real TCPStore through its
relay; a wrong secret, a stranger that says nothing, a torch client of its own and an
impostor gate are each refused in one line, while the store serves the job's ranks on; and
rank 0 listens on the job's address and loopback only."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from helpers import HANG_GUARD_S
from polyrhythm.errors import ConfigError
from polyrhythm.launch.launchers.spark_task import rendezvous_host
from polyrhythm.launch.rank import gate as gate_module
from polyrhythm.launch.rank.gate import (
    GREETING,
    NONCE,
    SECRET_FILE_VARIABLE,
    SECRET_VARIABLE,
    Gate,
    Relay,
    job_secret,
)
from polyrhythm.launch.rank.rendezvous import gated_store, interface_address, job_address

SECRET = b"the run's secret"
SHORT_S = 0.5  # a stranger's bound here: the tests wait for its end, never time it


@pytest.fixture
def store():
    """A real TCPStore on loopback, as rank 0 keeps it."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                           wait_for_workers=False)
    yield server


def said_lines() -> tuple[list[str], callable]:
    lines: list[str] = []
    return lines, lines.append


def through(relay: Relay) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", relay.port, None, False, timedelta(seconds=30))


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {HANG_GUARD_S} s"
        time.sleep(0.01)


def test_a_peer_with_the_secret_uses_the_store_through_its_relay(store):
    lines, say = said_lines()
    gate = Gate(SECRET, ("127.0.0.1", 0), store.port, say=say)
    client = through(Relay(SECRET, gate.address, 30.0))
    client.set("rank1", "up")
    store.set("rank0", "here")
    assert store.get("rank1") == b"up" and client.get("rank0") == b"here"
    assert client.add("count", 2) == 2 and store.add("count", 1) == 3
    assert gate.refused == [] and lines == []


def test_a_wrong_secret_is_refused_in_one_line_and_the_store_serves_on(store):
    lines, say = said_lines()
    gate = Gate(SECRET, ("127.0.0.1", 0), store.port, say=say)
    rank = through(Relay(SECRET, gate.address, 30.0))
    with pytest.raises(ConfigError, match="refused this rank's proof of the run's secret"):
        Relay(b"another secret", gate.address, 30.0)
    wait_until(lambda: gate.refused, "refusal")
    ((host, port),) = gate.refused
    assert host == "127.0.0.1"
    assert lines == [f"polyrhythm: refused a connection from 127.0.0.1:{port} to the job's "
                     "store: a wrong proof of the run's secret; the run goes on"]
    rank.set("after", "1")
    assert store.get("after") == b"1"


def test_a_silent_stranger_is_dropped_after_the_bound_while_the_store_serves(store):
    lines, say = said_lines()
    gate = Gate(SECRET, ("127.0.0.1", 0), store.port, handshake_s=SHORT_S, say=say)
    stranger = socket.create_connection(gate.address)
    stranger.settimeout(HANG_GUARD_S)
    # Meanwhile a rank joins and uses the store: the stranger holds no one up.
    rank = through(Relay(SECRET, gate.address, 30.0, handshake_s=HANG_GUARD_S))
    rank.set("during", "1")
    assert store.get("during") == b"1"
    heard = b""
    while chunk := stranger.recv(1024):  # the greeting, then the end
        heard += chunk
    assert heard.startswith(GREETING) and len(heard) == len(GREETING) + NONCE
    assert gate.refused == [stranger.getsockname()]
    assert lines == [f"polyrhythm: refused a connection from 127.0.0.1:"
                     f"{stranger.getsockname()[1]} to the job's store: no proof of the run's "
                     f"secret within {SHORT_S:g} s; the run goes on"]


def test_a_torch_client_of_a_strangers_own_cannot_use_the_store(store):
    lines, say = said_lines()
    gate = Gate(SECRET, ("127.0.0.1", 0), store.port, handshake_s=SHORT_S, say=say)
    store.set("gloo/address", "rank 0's")
    with pytest.raises((RuntimeError, dist.DistError)):
        stranger = dist.TCPStore(*gate.address, None, False, timedelta(seconds=1))
        stranger.get("gloo/address")
    wait_until(lambda: gate.refused, "refusal")
    assert "to the job's store" in lines[0] and store.get("gloo/address") == b"rank 0's"


def test_a_relay_refuses_a_gate_without_the_secret_and_another_program():
    impostor = socket.create_server(("127.0.0.1", 0))

    def answer_wrongly() -> None:
        conn, _ = impostor.accept()
        conn.sendall(GREETING + os.urandom(NONCE))
        conn.recv(1024)
        conn.sendall(os.urandom(32))

    threading.Thread(target=answer_wrongly, daemon=True).start()
    with pytest.raises(ConfigError, match="wrong proof of the run's secret: it is not this "
                                          "job's rank 0"):
        Relay(SECRET, impostor.getsockname(), 30.0)
    silent = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(ConfigError, match=f"did not answer within {SHORT_S:g} s"):
        Relay(SECRET, silent.getsockname(), 30.0, handshake_s=SHORT_S)
    other = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: other.accept()[0].sendall(b"HTTP/1.1 400\r\n" * 4),
                     daemon=True).start()
    with pytest.raises(ConfigError, match="is not polyrhythm's gate"):
        Relay(SECRET, other.getsockname(), 30.0)


def test_a_relay_waits_for_a_gate_not_yet_listening_then_gives_up_in_one_line(store):
    with socket.create_server(("127.0.0.1", 0)) as probe:
        free = probe.getsockname()
    with pytest.raises(ConfigError, match=f"the job's store at 127.0.0.1:{free[1]} did not "
                                          "answer within 0.3 s .*is rank 0 running"):
        Relay(SECRET, free, 0.3)
    late: list[Gate] = []
    timer = threading.Timer(0.2, lambda: late.append(Gate(SECRET, free, store.port)))
    timer.start()
    through(Relay(SECRET, free, HANG_GUARD_S)).set("late", "1")
    assert store.get("late") == b"1"
    timer.join()
    late[0].close()


def test_the_secret_comes_from_a_private_file_or_the_launchers_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_FILE_VARIABLE, raising=False)
    monkeypatch.delenv(SECRET_VARIABLE, raising=False)
    assert job_secret() is None
    monkeypatch.setenv(SECRET_VARIABLE, "abc123")
    assert job_secret() == b"abc123" and SECRET_VARIABLE not in os.environ  # not inherited
    path = tmp_path / "secret"
    path.write_text("from the file\n")
    path.chmod(0o600)
    monkeypatch.setenv(SECRET_FILE_VARIABLE, str(path))
    assert job_secret() == b"from the file"
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"others may read it \(mode 0644\): chmod 600 it"):
        job_secret()
    path.write_text("")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="the file is empty"):
        job_secret()
    monkeypatch.setenv(SECRET_FILE_VARIABLE, str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="cannot read it"):
        job_secret()
    assert len(gate_module.new_secret()) == 64 and gate_module.new_secret() != "0" * 64


def listening(pid: int) -> set[tuple[str, int]]:
    return {c.laddr[:2] for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def external_address() -> str | None:
    """An address of this machine beside loopback (the route towards a documentation
    network's; UDP's connect sends nothing), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.mark.parametrize("where", ["loopback", "external"])
def test_rank_0_listens_on_the_job_address_and_loopback_only(monkeypatch, where):
    """The store rank 0 makes where it hosts it (Spark's ranks): the gate on MASTER_ADDR and
    MASTER_PORT, the store itself on loopback; nothing on every interface. A rank through
    the gate uses it."""
    address = "127.0.0.1" if where == "loopback" else external_address()
    if address is None:
        pytest.skip("this machine has no address beside loopback")
    with socket.create_server((address, 0)) as probe:
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", address)
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    before = listening(os.getpid())
    store = gated_store(SECRET, 0, 2, timedelta(seconds=30))
    opened = listening(os.getpid()) - before
    assert (address, port) in opened
    assert {host for host, _ in opened} <= {address, "127.0.0.1"}, opened
    assert ("127.0.0.1", store.port) in opened and len(opened) == 2
    other = gated_store(SECRET, 1, 2, timedelta(seconds=30))
    other.set("rank 1", "in")
    assert store.get("rank 1") == b"in"
    assert not any(host in ("0.0.0.0", "::") for host, _ in listening(os.getpid()) - before)


def test_under_torchrun_the_gate_is_on_gloos_address_and_published(monkeypatch):
    """torchrun's agent holds a store at MASTER_ADDR:MASTER_PORT: rank 0's gate listens on
    the address Gloo uses, a free port, and says where in torchrun's store."""
    agent = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    store = gated_store(SECRET, 0, 2, timedelta(seconds=30))
    host, port = agent.get("polyrhythm/gate").decode().split()
    assert host == "127.0.0.1" and int(port) not in (agent.port, store.port)
    gated_store(SECRET, 1, 2, timedelta(seconds=30)).set("through", "the gate")
    assert store.get("through") == b"the gate"


def test_the_job_address_is_gloos_interface_the_master_here_or_the_host_name(monkeypatch):
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(ConfigError, match="GLOO_SOCKET_IFNAME=nosuch0: no IPv4 address"):
        interface_address("nosuch0")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,eth9")
    assert job_address("203.0.113.7") == "127.0.0.1"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert job_address("127.0.0.1") == "127.0.0.1"
    assert job_address("203.0.113.7") == socket.gethostbyname(socket.gethostname())


def test_spark_tasks_all_on_one_host_meet_on_loopback():
    assert rendezvous_host(["10.0.0.5", "10.0.0.5", "10.0.0.5"]) == "127.0.0.1"
    assert rendezvous_host(["10.0.0.5", "10.0.0.6"]) == "10.0.0.5"


# --- joining: every rank comes to the store before Gloo connects them -----------------------

LATE_TIMEOUT_S = 1.0  # the group's timeout (--timeout) in the late-rank case


def _join_late(rank: int, path: str, out: str) -> None:
    """Join a 2-rank job with --timeout 1 s, rank 1 starting once rank 0 has waited past it."""
    from pathlib import Path

    from polyrhythm.comm import group

    marker = Path(out) / "waiting"
    if rank == 1:
        deadline = time.monotonic() + HANG_GUARD_S
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(3 * LATE_TIMEOUT_S)  # the lateness under test, past rank 0's --timeout
    else:
        marker.touch()
    try:
        group.join(rank, 2, LATE_TIMEOUT_S, store=group.file_store(path, 2, LATE_TIMEOUT_S))
        group.leave()
        (Path(out) / f"{rank}.joined").touch()
    except BaseException as exc:  # the test reads it
        (Path(out) / f"{rank}.failed").write_text(repr(exc))


def test_a_rank_starting_later_than_the_timeout_still_joins(tmp_path):
    """Ranks start at different times: the store waits for all of them (group.join_wait,
    120 s) before Gloo connects them, whose own wait is --timeout (here 1 s; a host
    starting 3 s late had failed the job's start)."""
    from polyrhythm.launch.process import forkserver

    ctx = forkserver.context()
    procs = [ctx.Process(target=_join_late, args=(r, str(tmp_path / "store"), str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(HANG_GUARD_S)
    failed = {f.name: f.read_text() for f in tmp_path.glob("*.failed")}
    assert not failed and {f.name for f in tmp_path.glob("*.joined")} == {"0.joined",
                                                                          "1.joined"}, failed


def test_a_rank_that_never_comes_is_named():
    """The store's wait runs out (here a store of 1 s) with the ranks missing named."""
    from polyrhythm.comm import group
    from polyrhythm.comm.faults import PeerSilent

    store = dist.TCPStore("127.0.0.1", 0, 3, True, timedelta(seconds=1),
                          wait_for_workers=False)
    store.set(f"{group.HERE}1", "1")  # rank 1 came; rank 2 never does
    with pytest.raises(PeerSilent, match=r"^rank 2 did not join the job: not within the "
                                         r"store's wait of 1 s \(missing: rank 2\)$"):
        group.join(0, 3, 1.0, store=store)
