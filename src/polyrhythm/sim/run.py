"""Which engine simulates a strategy: its family says (strategies/spec.py)."""

from __future__ import annotations

import math

from polyrhythm.errors import ConfigError
from polyrhythm.sim.collective import simulate_collective
from polyrhythm.sim.compressed import HEADER
from polyrhythm.sim.ps import simulate_ps
from polyrhythm.sim.result import SimResult
from polyrhythm.sim.setup import BYTES, Costs, setup
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.parameter_server import PS_WORKER
from polyrhythm.strategies.spec import COLLECTIVE, DECENTRALISED, PARAMETER_SERVER, SWITCHING

SIMULATED_DECENTRALISED = {"localsgd"}


def simulate(config, costs: Costs, iterations: int = 100) -> SimResult:
    """Simulate `config` (a RunConfig: strategy, workers, servers, cluster, compute) with
    these costs for `iterations` steps per worker."""
    spec = STRATEGIES[config.strategy.name]
    s = setup(config, costs, iterations)
    settings = config.strategy
    if spec.family == PARAMETER_SERVER and spec.worker == PS_WORKER:
        return simulate_ps(s, spec.name, lambda: spec.policy(settings, s.workers), settings)
    if spec.family == COLLECTIVE:
        return simulate_collective(s, spec.name, spec.worker_args.get("algorithm", "native"))
    if spec.family == DECENTRALISED and spec.name in SIMULATED_DECENTRALISED:
        return simulate_collective(s, spec.name, "native", every=settings.tau)
    if spec.family == SWITCHING:
        return _switch(s, settings)
    raise ConfigError(f"the simulator does not model strategy {spec.name!r} (it models the "
                      "parameter-server strategies but easgd, the collective ones, localsgd "
                      "and switch)")


def _switch(s, settings) -> SimResult:
    """Strategy-Switch at a fixed share of the steps (rule `at`; the other rules decide on
    measurements a simulation does not have): the collective phase, worker 0's handover of
    weights and momentum to every server, then the parameter-server phase."""
    if settings.rule != "at":
        raise ConfigError(f"the simulator switches by rule at only (a share of the steps), "
                          f"got rule {settings.rule!r}")
    switch_at = math.floor(settings.at * s.iterations)
    first = STRATEGIES[settings["from"].name]
    then = STRATEGIES[settings.to.name]
    net = s.network()
    before = simulate_collective(s, "switch", first.worker_args.get("algorithm", "native"),
                                 phase=(0, switch_at), net=net)
    start = [log.end for log in before.logs]
    handover = max(start)
    for (server, _), values in zip(s.buckets, s.values, strict=True):
        # Weights and momentum of each bucket, dense, from worker 0.
        arrives = net.send(handover, s.worker_host(0), s.host[server],
                           2 * (values * BYTES + HEADER))
        handover = max(handover, arrives)
    return simulate_ps(s, "switch", lambda: then.policy(settings.to, s.workers), settings.to,
                       net=net, start=[max(t, handover) for t in start], logs=before.logs,
                       done=switch_at)


__all__ = ["BYTES", "Costs", "SimResult", "simulate"]
