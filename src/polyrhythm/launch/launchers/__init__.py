"""What starts and supervises a job's ranks, by name (registry.py): on loopback (local.py; a
user's script: script_launcher.py), on an emulated cluster (emulated.py), on Spark
(spark*.py; the mapreduce strategy's driver: mapreduce.py); and the progress board a
terminal shows (progress.py)."""
