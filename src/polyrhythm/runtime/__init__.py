"""The runtime: what every process of a job does, in rooms that a contract keeps apart:
job.py gives a rank its role; a worker's steps, epochs, checkpoints and report run through
the one Job a script or the built-in job drives (worker/: engine.py, script.py, builtin.py,
and the optimizer job.wrap returns, job_optimizer.py); a parameter-server shard serves its
buckets (server/: server.py, bucket.py); both keep checkpoints (checkpoint.py, digests.py,
intact.py) and the epochs' models (snapshots.py), and rank 0 sums up the run (summary.py).
mapreduce.py is the mapreduce strategy's arithmetic for Spark's executors and driver."""
