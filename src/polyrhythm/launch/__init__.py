"""Starting the processes of a job and each process's life, in four rooms, each importing
only the rooms below it (pyproject.toml's contracts):

- `launchers/`: what starts and supervises a job's ranks (the local launcher, the emulated
  cluster's, a user's script's, Spark's), chosen by name in `launchers/registry.py`, and the
  terminal's progress board;
- `rank/`: the life of one rank in its own process, whoever started it: joining the job
  (`rendezvous`, behind rank 0's `gate`), the built-in job's life (`life`), a forked rank's
  entry (`forked`), a user's script's `polyrhythm.init()` (`script_rank`, `preloaded`), a
  rank started by torchrun (`torchrun`, entry point polyrhythm.node);
- `cluster/`: the emulated cluster's plumbing (network namespaces, links, CPU cgroups, the
  fidelity guard, the janitor of what a killed run left);
- `process/`: what launchers and ranks share about processes: the forkserver ranks fork
  from, signals, prctl, each rank's events and failure reports, the run's lock.
"""
