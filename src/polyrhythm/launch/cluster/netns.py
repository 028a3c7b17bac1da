"""The emulated cluster's network: one Linux network namespace per host, each with one veth
link to a bridge in the machine's own namespace, and each link shaped by `tc` in both
directions (tbf on the host's end limits what it sends, tbf on the bridge's end what it
receives), as a full-duplex NIC of that rate would.

Everything made here is named from the cluster's tag, so it can be listed and removed:
namespaces `pr-<name>-h<i>`, the bridge `pr<tag>`, links `pr<tag>h<i>` (the host's end, in
its namespace) and `pr<tag>h<i>b` (the bridge's end). Linux caps link names at 15 bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from polyrhythm.errors import ClusterError
from polyrhythm.units import rate

PREFIX = "pr"
NAMESPACE_PREFIX = "pr-"
# tbf's bucket: 32 KiB (a few segments; less starves TCP below the rate) or 1 ms of the rate
# if more: a message passes its first bucket-full at once, so a larger bucket would make
# messages of a few hundred KB look faster than the rate. Its queue holds 100 ms of traffic.
MIN_BURST_BYTES = 32 * 1024
QUEUE = "100ms"
# Every host's TCP congestion control, whatever this machine's default: Reno, loss-based,
# which every Linux allows in a namespace and which fills a link as the simulator's links
# do (sim/network.py). This machine's default, BBR, paces each flow at the rate it last
# measured: eight asp workers' bursts of pushes then left a server's 100 mbit link a fifth
# idle (733 samples/s with BBR, 882 with Reno), and a 16-member ring lost 10 %.
CONGESTION_CONTROL = "reno"


def require_tools() -> None:
    """One clear line when this machine cannot emulate a cluster."""
    if os.geteuid() != 0:
        raise ClusterError("an emulated cluster needs root (network namespaces, tc, cgroups); "
                           "run as root, or drop --hosts")
    missing = [tool for tool in ("ip", "tc", "sysctl") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"an emulated cluster needs {', '.join(missing)} (Debian: "
                           "apt-get install iproute2 procps)")


def run(*args: str, ok_if: str | None = None) -> str:
    """Run a command; a failure is one ClusterError line (unless its message has `ok_if`)."""
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip()).splitlines()
        line = message[-1] if message else f"exit code {done.returncode}"
        if ok_if is not None and ok_if in line:
            return ""
        raise ClusterError(f"{' '.join(args[:4])} ...: {line}")
    return done.stdout


def state(device: str) -> str:
    """A link's operational state in this namespace ("up", "down", "lowerlayerdown"...;
    "gone" if it is not there)."""
    try:
        return (Path("/sys/class/net") / device / "operstate").read_text().strip()
    except OSError:
        return "gone"


def address(host: int) -> str:
    """Host `host`'s address (10.213.0.0/16: up to 64,000 hosts)."""
    return f"10.213.{host // 250}.{host % 250 + 1}"


@dataclass(frozen=True)
class Link:
    """One host's place on the network."""

    host: int
    namespace: str
    device: str   # the host's end of its link, inside its namespace
    peer: str     # the bridge's end
    address: str


class Network:
    """The namespaces, links and bridge of one cluster (`name`, short `tag`)."""

    def __init__(self, name: str, tag: str, hosts: int) -> None:
        self.bridge = f"{PREFIX}{tag}"
        self.links = [Link(h, f"{NAMESPACE_PREFIX}{name}-h{h}", f"{PREFIX}{tag}h{h}",
                           f"{PREFIX}{tag}h{h}b", address(h)) for h in range(hosts)]

    def create(self, bandwidth: list[str | None]) -> None:
        """Make the bridge, the hosts and their links, shaped at `bandwidth` per host."""
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "link", "set", self.bridge, "up")
        for link, limit in zip(self.links, bandwidth, strict=True):
            run("ip", "netns", "add", link.namespace)
            run("ip", "link", "add", link.device, "type", "veth", "peer", "name", link.peer)
            run("ip", "link", "set", link.device, "netns", link.namespace)
            run("ip", "link", "set", link.peer, "master", self.bridge, "up")
            inside = ("ip", "netns", "exec", link.namespace)
            run(*inside, "ip", "addr", "add", f"{link.address}/16", "dev", link.device)
            run(*inside, "ip", "link", "set", link.device, "up")
            run(*inside, "ip", "link", "set", "lo", "up")
            run(*inside, "sysctl", "-qw",
                f"net.ipv4.tcp_congestion_control={CONGESTION_CONTROL}")
            if limit is not None:
                shape = _tbf(limit)
                run(*inside, "tc", "qdisc", "add", "dev", link.device, "root", *shape)
                run("tc", "qdisc", "add", "dev", link.peer, "root", *shape)

    def destroy(self) -> None:
        """Remove whatever of this network exists (a link goes with its namespace)."""
        for link in self.links:
            run("ip", "netns", "delete", link.namespace, ok_if="No such file")
            run("ip", "link", "delete", link.peer, ok_if="Cannot find device")
        run("ip", "link", "delete", self.bridge, ok_if="Cannot find device")

    def congestion_control(self) -> str | None:
        """The TCP congestion control the hosts run, as host 0's namespace says (a standing
        cluster made by an older polyrhythm may not run CONGESTION_CONTROL); None if it
        cannot be read, which is no reason to fail a run that has ended."""
        try:
            return run("ip", "netns", "exec", self.links[0].namespace, "sysctl", "-n",
                       "net.ipv4.tcp_congestion_control").strip()
        except ClusterError:
            return None

    def exists(self) -> bool:
        return bool(run("ip", "link", "show", self.bridge, ok_if="does not exist"))


def _tbf(limit: str) -> list[str]:
    bits = rate(limit, "bandwidth")
    burst = max(MIN_BURST_BYTES, int(bits / 8 / 1000))
    return ["tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", QUEUE]


# Exactly the names made here, so nothing else on the machine that starts with "pr" is taken.
CLUSTER_NAME = r"[a-z][a-z0-9]{0,11}"  # short enough for the link names of its tag
OUR_NAMESPACE = re.compile(rf"pr-{CLUSTER_NAME}-h\d+")
OUR_LINK = re.compile(r"pr[0-9a-f]{6}(h\d+b?)?")


def ours() -> dict[str, list[str]]:
    """Every namespace, link and qdisc of ours on this machine (none once all is torn down)."""
    namespaces = [name for line in run("ip", "netns", "list").splitlines()
                  if OUR_NAMESPACE.fullmatch(name := line.split()[0])]
    links = [name for line in run("ip", "-o", "link", "show").splitlines()
             if OUR_LINK.fullmatch(name := line.split(":")[1].strip().split("@")[0])]
    qdiscs = [line for line in run("tc", "qdisc", "show").splitlines()
              if any(f"dev {link} " in line for link in links) and "tbf" in line]
    return {"namespaces": namespaces, "links": links, "qdiscs": qdiscs}
