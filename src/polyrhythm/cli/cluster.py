"""`polyrhythm cluster up|status|down`: a standing emulated cluster, which runs of the same
shape (hosts, bandwidth, cpu) use instead of making their own."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import add_flag
from polyrhythm.config import load_config
from polyrhythm.config.emulation import CLUSTER, standing_shape

SHAPE = ("hosts", "bandwidth", "cpu")


def add_parser(commands) -> None:
    cluster = commands.add_parser(
        "cluster", help="bring a standing emulated cluster up or down, or show it",
        description="A standing emulated cluster: hosts as network namespaces of this "
        "machine, their links shaped by tc and their CPU shares set by cgroups. Runs whose "
        "[cluster] has the same hosts, bandwidth and cpu use it. Needs root.")
    actions = cluster.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="make a standing cluster")
    up.add_argument("--name", default="default", help="its name (default: default)")
    up.add_argument("--config", metavar="FILE.toml", help="the cluster a run of this config "
                    "has (its hosts, bandwidth and cpu); flags override it")
    for p in CLUSTER:
        if p.name in SHAPE:
            add_flag(up, p, p.help)
    actions.add_parser("status", help="show the standing clusters and anything else of ours")
    down = actions.add_parser("down", help="remove a standing cluster (its processes killed)")
    down.add_argument("--name", default="default", help="its name (default: default)")
    down.add_argument("--all", action="store_true", help="remove every namespace, link, "
                      "qdisc and cgroup of polyrhythm's on this machine")


def run(args: argparse.Namespace) -> int:
    from polyrhythm.launch.cluster.hosts import (
        ClusterShape,
        EmulatedCluster,
        can_emulate,
        leftovers,
        remove_everything,
    )

    can_emulate()
    if args.action == "up":
        given = {}
        if args.config:  # the cluster a run of this config would have (hosts resolved)
            cluster = load_config(args.config).cluster
            given = {k: cluster[k] for k in SHAPE if cluster[k]}
        given |= {k: getattr(args, k) for k in SHAPE if getattr(args, k) is not None}
        cluster = EmulatedCluster(args.name, ClusterShape.of(standing_shape(given)))
        cluster.up(standing=True)
        print(f"cluster {args.name} is up:")
        _show(cluster)
    elif args.action == "down":
        if args.all:
            remove_everything()
            print("removed every namespace, link, qdisc and cgroup of polyrhythm's")
        elif not EmulatedCluster.is_standing(args.name):  # nothing to remove is no error
            print(f"no standing cluster {args.name!r}: nothing to remove")
        else:
            EmulatedCluster.standing(args.name).down()
            print(f"cluster {args.name} is down")
    else:
        standing = EmulatedCluster.all_standing()
        for cluster in standing:
            print(f"cluster {cluster.name}:")
            _show(cluster)
        theirs = {link.namespace for c in standing for link in c.links}
        others = [ns for ns in leftovers()["namespaces"] if ns not in theirs]
        if others:
            print("hosts of runs going on: " + ", ".join(sorted(others)))
        if not standing and not others:
            print("no emulated cluster is up")
    return 0


def _show(cluster) -> None:
    for host in cluster.status():
        print(f"  host {host['host']}: {host['namespace']} {host['address']}  "
              f"{host['shape']}  {host['processes']} processes")
