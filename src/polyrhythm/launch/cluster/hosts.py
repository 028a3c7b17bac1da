"""An emulated cluster: hosts inside this machine, each a network namespace with its own
address on one bridge, its link shaped by tc (launch/cluster/netns.py) and its CPU share set by a
cgroup quota (launch/cluster/cgroups.py). Latency is the transport's (comm/delay.py): this kernel
has no netem.

A run with `hosts` makes a cluster of its own and removes it when it ends; `polyrhythm
cluster up` makes a standing one (described in STATE_DIR) that runs of the same shape use
until `polyrhythm cluster down`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from polyrhythm.config.emulation import per_host
from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster import cgroups, netns
from polyrhythm.launch.cluster.cgroups import CpuGroup, hierarchy, remove_root_if_empty
from polyrhythm.units import rate

STATE_DIR = Path(os.environ.get("POLYRHYTHM_STATE_DIR", "/run/polyrhythm"))


@dataclass(frozen=True)
class ClusterShape:
    """What a cluster is: its hosts, each host's link rate and CPU share (None: unlimited)."""

    hosts: int
    bandwidth: tuple[str | None, ...]
    cpu: tuple[float | None, ...]

    @classmethod
    def of(cls, cluster) -> ClusterShape:
        """The shape a run's [cluster] settings ask for."""
        return cls(cluster.hosts, tuple(per_host(cluster.bandwidth, cluster.hosts)),
                   tuple(per_host(cluster.cpu, cluster.hosts)))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClusterShape:
        state = json.loads(text)
        return cls(state["hosts"], tuple(state["bandwidth"]), tuple(state["cpu"]))

    def same_as(self, other: ClusterShape) -> bool:
        """The same cluster, rates compared as rates (1gbit is 1000mbit)."""
        def key(shape: ClusterShape) -> tuple:
            return (shape.hosts, [rate(b) if b else None for b in shape.bandwidth], shape.cpu)
        return key(self) == key(other)

    def describe(self, host: int) -> str:
        link, cpu = self.bandwidth[host], self.cpu[host]
        return (f"{link or 'unlimited'} link, "
                f"{f'{cpu:g} cores' if cpu is not None else 'unlimited CPU'}")


    def summary(self) -> str:
        """Its hosts, links and CPU shares in a line: `2 hosts, each 1gbit link, 0.5 cores`."""
        hosts = [self.describe(h) for h in range(self.hosts)]
        if self.hosts == 1:
            return f"1 host, {hosts[0]}"
        if len(set(hosts)) == 1:
            return f"{self.hosts} hosts, each {hosts[0]}"
        return f"{self.hosts} hosts: " + "; ".join(hosts)


class EmulatedCluster:
    """One cluster's namespaces, links, qdiscs and cgroups, by its name."""

    def __init__(self, name: str, shape: ClusterShape) -> None:
        if not re.fullmatch(netns.CLUSTER_NAME, name):
            raise ClusterError(f"cluster name must be a lower-case letter then up to 11 letters "
                               f"or digits, got {name!r}")
        self.name, self.shape = name, shape
        tag = hashlib.sha1(name.encode()).hexdigest()[:6]
        self.network = netns.Network(name, tag, shape.hosts)

    @classmethod
    def temporary(cls, shape: ClusterShape) -> EmulatedCluster:
        return cls(f"run{secrets.token_hex(3)}", shape)

    @property
    def links(self) -> list[netns.Link]:
        return self.network.links

    def host_group(self, host: int) -> CpuGroup:
        return CpuGroup(self.name, f"h{host}")

    def up(self, standing: bool = False) -> None:
        """Make every host; on any failure remove what was made. A standing cluster is
        described in STATE_DIR for later runs, `status` and `down`."""
        can_emulate()
        if self.network.exists():
            raise ClusterError(f"cluster {self.name!r} is already up")
        try:
            self.network.create(list(self.shape.bandwidth))
            for host, cores in enumerate(self.shape.cpu):
                self.host_group(host).create(cores)
            if standing:
                STATE_DIR.mkdir(parents=True, exist_ok=True)
                self._state_path(self.name).write_text(self.shape.to_json())
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Kill every process on the cluster and remove everything it made."""
        for host in range(self.shape.hosts):
            self.host_group(host).remove()
        if (group := CpuGroup(self.name)).exists():
            group.remove()
        self.network.destroy()
        remove_root_if_empty()
        self._state_path(self.name).unlink(missing_ok=True)

    def run_groups(self, run_id: str) -> list[CpuGroup]:
        """A group per host for one run's processes, inside the host's (under its quota)."""
        return [CpuGroup(self.name, f"h{h}", run_id).create() for h in range(self.shape.hosts)]

    def command(self, host: int, args: list[str]) -> list[str]:
        """`args` run on host `host`."""
        return ["ip", "netns", "exec", self.links[host].namespace, *args]

    def set_link(self, host: int, up: bool) -> None:
        """Take host `host`'s link down (its cable pulled: the bridge's end down, so nothing
        reaches or leaves the host; its qdiscs stay) or bring it back up."""
        netns.run("ip", "link", "set", self.links[host].peer, "up" if up else "down")

    def links_down(self) -> list[int]:
        """The hosts whose link is down now."""
        return [link.host for link in self.links if netns.state(link.peer) != "up"]

    def status(self) -> list[dict]:
        """Each host: its namespace, address, link, CPU share and processes running."""
        return [{"host": link.host, "namespace": link.namespace, "address": link.address,
                 "shape": self.shape.describe(link.host),
                 "processes": len(self.host_group(link.host).pids())}
                for link in self.links]

    @staticmethod
    def _state_path(name: str) -> Path:
        return STATE_DIR / f"{name}.json"

    @classmethod
    def is_standing(cls, name: str) -> bool:
        """Whether `cluster up` made a standing cluster `name` (not yet down)."""
        return cls._state_path(name).exists()

    @classmethod
    def standing(cls, name: str) -> EmulatedCluster:
        """The standing cluster `name`, as `cluster up` described it."""
        try:
            shape = ClusterShape.from_json(cls._state_path(name).read_text())
        except (OSError, ValueError, KeyError):
            raise ClusterError(f"no standing cluster {name!r} (polyrhythm cluster up)") from None
        return cls(name, shape)

    @classmethod
    def all_standing(cls) -> list[EmulatedCluster]:
        if not STATE_DIR.is_dir():
            return []
        return [cls.standing(p.stem) for p in sorted(STATE_DIR.glob("*.json"))]


def standing_of_shape(shape: ClusterShape) -> EmulatedCluster | None:
    """A standing cluster a run of this shape can use, if one is up."""
    return next((c for c in EmulatedCluster.all_standing()
                 if c.shape.same_as(shape) and c.network.exists()), None)


def can_emulate() -> None:
    """One ClusterError line if this machine cannot emulate a cluster."""
    netns.require_tools()
    hierarchy()


def remove_everything() -> None:
    """Remove every namespace, link (and so qdisc) and cgroup of ours, standing or not,
    killing the processes in them: the way out of anything left behind."""
    can_emulate()
    for namespace in netns.ours()["namespaces"]:
        netns.run("ip", "netns", "delete", namespace, ok_if="No such file")
    for link in netns.ours()["links"]:
        netns.run("ip", "link", "delete", link, ok_if="Cannot find device")
    root, _ = hierarchy()
    if root.exists():
        for child in [p for p in root.iterdir() if p.is_dir()]:
            CpuGroup(child.name).remove()
    remove_root_if_empty()
    for state in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
        state.unlink()


def leftovers() -> dict[str, list[str]]:
    """Every namespace, link, qdisc and cgroup of ours on this machine."""
    return {**netns.ours(), "cgroups": cgroups.ours()}
