"""The life of one rank, in its own process, whoever started it: joining the job's process
group (rendezvous.py, behind rank 0's gate.py), the built-in job's life (life.py) as a rank
forked by the local launcher enters it (forked.py) or one started by torchrun (torchrun.py,
entry point polyrhythm.node), and a user's script joining its job (script_rank.py's
`polyrhythm.init()`; preloaded.py: its rank forked from the forkserver)."""
