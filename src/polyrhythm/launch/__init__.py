"""Starting the processes of a job: locally (local.py, forked from a forkserver) or by
torchrun (torchrun.py, entry point polyrhythm.node); rank.py is the life of every rank."""
