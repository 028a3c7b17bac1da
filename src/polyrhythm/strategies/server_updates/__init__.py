"""What a parameter server's update does with the pushes its policy gathers into it: the
arithmetic of one bucket's update, one class a module, each owning its state.

A strategy declares its server update (StrategySpec.server_update) by one of the names below;
its policy (strategies/consistency.py) only decides when pushes are gathered, applied and
answered. A new server update is a module here, a name below and the strategy that
declares it. The names are strings, so that declaring and checking a strategy imports no
torch; the server loads the class when it builds its buckets (runtime/server/bucket.py).

- SUM: the pushes' batch-weighted sum, stepped by the run's optimizer (bsp, asp, ssp, ...).
- MEAN: their mean, for policies whose update holds a varying number of pushes (k-BSP,
  backup workers, softsync).
- ELASTIC: EASGD's centre, which adds the workers' elastic differences.
- DELAY_COMPENSATED: DC-ASGD's compensation of each stale gradient, then SUM's step.
"""

_HERE = "polyrhythm.strategies.server_updates"
SUM = f"{_HERE}.sum:GradientSum"
MEAN = f"{_HERE}.mean:GradientMean"
ELASTIC = f"{_HERE}.elastic:ElasticCentre"
DELAY_COMPENSATED = f"{_HERE}.dcasgd:DelayCompensated"

# Server updates whose pushes are not gradients: the servers' count of the global batches
# applied (shared epochs) has nothing to count.
NOT_GRADIENTS = frozenset({ELASTIC})
