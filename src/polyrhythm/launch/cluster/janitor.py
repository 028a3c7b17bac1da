"""The janitor of an emulated run: a small process that outlives its launcher and, if the
launcher dies without saying it is done (SIGKILL, a crash), kills the run's processes,
removes what the run made (its cgroups; its cluster, if the run made one) and records the
run as failed. A launcher that ends normally cleans up itself and dismisses the janitor.

    python -m polyrhythm.launch.cluster.janitor '{"cluster": ..., "shape": ..., "own": ..., ...}'

It watches its standard input, a pipe only the launcher writes: "done" dismisses it,
end-of-file without "done" means the launcher is gone (or could not clean up all itself). It
runs in a session of its own, so the Ctrl-C that stops the launcher does not stop it first.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from polyrhythm.errors import PolyrhythmError
from polyrhythm.launch.cluster.cgroups import CpuGroup
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster
from polyrhythm.metrics.records import RunRecord, fail_run

DONE = b"done\n"


class Janitor:
    """The launcher's side: start the janitor, and dismiss it once cleaned up."""

    def __init__(self, cluster: EmulatedCluster, own: bool, record: RunRecord) -> None:
        job = {"cluster": cluster.name, "shape": cluster.shape.to_json(), "own": own,
               "out": str(record.out), "run_id": record.run_id}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "polyrhythm.launch.cluster.janitor", json.dumps(job)],
            stdin=subprocess.PIPE, start_new_session=True)

    def dismiss(self) -> None:
        """The launcher cleaned up: the janitor leaves without doing anything."""
        self._close(DONE)

    def clean_up_now(self) -> bool:
        """The launcher could not clean up all: the janitor tries now. True if it could."""
        return self._close(b"") == 0

    def _close(self, said: bytes) -> int:
        try:
            self._process.stdin.write(said)
            self._process.stdin.close()
        except OSError:
            pass
        return self._process.wait()


def clean_up(job: dict) -> None:
    """Kill the run's processes and remove what it made; record it as failed."""
    cluster = EmulatedCluster(job["cluster"], ClusterShape.from_json(job["shape"]))
    for host in range(cluster.shape.hosts):
        CpuGroup(cluster.name, f"h{host}", job["run_id"]).remove()
    if job["own"]:
        cluster.down()
    fail_run(RunRecord(Path(job["out"]), job["run_id"]),
             "failed: the launcher was killed; all processes stopped")


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = json.loads(sys.argv[1])
    said = sys.stdin.buffer.read()  # until the launcher closes the pipe or dies
    if said == DONE:
        return 0
    try:
        clean_up(job)
    except PolyrhythmError as exc:
        print(f"polyrhythm janitor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
