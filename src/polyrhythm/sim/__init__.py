"""polyrhythm.sim: a discrete-event simulator of the same strategies on clusters that do not
fit on this machine, calibrated from stored runs (DESIGN.md: it uses the strategies' pure
rules, their policies and cadences, and the runtime's layout, nothing of comm or launch)."""

from polyrhythm.sim.run import simulate
from polyrhythm.sim.setup import Costs

__all__ = ["Costs", "simulate"]
