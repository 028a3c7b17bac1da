"""Every training strategy, by name. A new algorithm is one module and one line here.

The declarations (strategies/parameter_server.py, collective.py, decentralised.py,
switching.py) and their
pure rules (consistency.py, cadence.py) import neither torch nor the transport; the worker
side of each strategy (ps_worker.py, easgd.py, allreduce.py, averaging.py, gossip.py) is
loaded when a run builds it.
"""

from polyrhythm.strategies import collective as _collective
from polyrhythm.strategies import decentralised as _decentralised
from polyrhythm.strategies import mapreduce as _mapreduce
from polyrhythm.strategies import parameter_server as _ps
from polyrhythm.strategies import switching as _switching
from polyrhythm.strategies.spec import STRATEGIES, StrategySpec

STRATEGIES.register(_ps.BSP)
STRATEGIES.register(_ps.ASP)
STRATEGIES.register(_ps.SSP)
STRATEGIES.register(_ps.KBSP)
STRATEGIES.register(_ps.KASP)
STRATEGIES.register(_ps.BACKUP)
STRATEGIES.register(_ps.SOFTSYNC)
STRATEGIES.register(_ps.DOWNPOUR)
STRATEGIES.register(_ps.DCASGD)
STRATEGIES.register(_ps.EASGD)
STRATEGIES.register(_collective.ALLREDUCE)
STRATEGIES.register(_collective.RING)
STRATEGIES.register(_collective.REDUCE_BROADCAST)
STRATEGIES.register(_collective.TREE)
STRATEGIES.register(_decentralised.LOCALSGD)
STRATEGIES.register(_decentralised.DPSGD)
STRATEGIES.register(_decentralised.GOSSIP)
STRATEGIES.register(_decentralised.TREE_EASGD)
STRATEGIES.register(_switching.SWITCH)
STRATEGIES.register(_mapreduce.MAPREDUCE)

__all__ = ["STRATEGIES", "StrategySpec"]
