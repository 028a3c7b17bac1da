"""The runtime: what every process of a job does (job.py): a worker's steps, epochs and
checkpoints through the one Job a script or the built-in job drives (engine.py, script.py,
builtin.py), or a parameter-server shard (server.py, its buckets in bucket.py), and how rank
0 sums up the run (summary.py)."""
