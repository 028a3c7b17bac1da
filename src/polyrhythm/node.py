"""Entry point for torchrun and other launchers of torchrun-style ranks:

    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-endpoint HOST:PORT -m polyrhythm.node run.toml

(launch/rank/torchrun.py does the work.)
"""

from polyrhythm.launch.rank.life import leave_now
from polyrhythm.launch.rank.torchrun import main

if __name__ == "__main__":
    leave_now(main(), exit_handlers=True)
