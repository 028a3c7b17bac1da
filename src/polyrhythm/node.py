"""Entry point for torchrun and other launchers of torchrun-style ranks:

    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-endpoint HOST:PORT -m polyrhythm.node run.toml

(launch/torchrun.py does the work.)
"""

import sys

from polyrhythm.launch.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
