"""The life of one rank, in its own process, whoever started it: joining the job's process
group (rendezvous.py, behind rank 0's gate.py), the one life every rank lives (life.py:
enter, live, finish, leave; polyrhythm train's job is its `lifecycle`), entered by a rank
forked by the local launcher (forked.py), one started by torchrun (torchrun.py, entry point
polyrhythm.node), or a user's script joining its job (script_rank.py's `polyrhythm.init()`;
preloaded.py: its rank forked from the forkserver)."""
