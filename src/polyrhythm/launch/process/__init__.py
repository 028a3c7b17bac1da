"""What launchers and ranks share about processes: the forkserver ranks fork from
(forkserver.py), signals (signals.py) and prctl (prctl.py), the events and failure reports a
rank leaves its launcher (events.py, failures.py), and the lock a run's ranks hold
(runlock.py)."""
