"""The runtime: what every process of a job does (job.py), as a worker (worker.py) or a
parameter-server shard (server.py), and how rank 0 sums up the run (summary.py)."""
