"""Entry point for torchrun and other launchers of torchrun-style ranks:

    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-endpoint HOST:PORT -m polyrhythm.node run.toml

(launch/rank/torchrun.py does the work.)
"""

import atexit
import os
import sys

from polyrhythm.launch.rank.torchrun import main


def exit_now(code: int) -> None:
    """Exit with `code` after Python's exit handlers but without C++ static destructors:
    after a lost peer, Gloo's threads can abort them ("terminate called without an active
    exception"), and a rank that said why it failed would then look crashed (SIGABRT)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
