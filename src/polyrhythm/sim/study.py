"""A simulated study: predictions for a set of configs, each with its speed-up over one
worker, and, where a config comes from a stored run (calibration), the run's measurement
and the prediction's error."""

from __future__ import annotations

from dataclasses import dataclass

from polyrhythm.config import RunConfig, make_config
from polyrhythm.sim.calibrate import Calibration
from polyrhythm.sim.result import SimResult
from polyrhythm.sim.run import simulate
from polyrhythm.sim.setup import Costs


@dataclass
class Prediction:
    """One config's simulation; `efficiency` is samples/s over N times one worker's;
    `measured` the calibrating run's samples/s (None: no run), `cores_bound` what its
    emulating machine's cores allow (None: no bound, hosts of their own)."""

    config: RunConfig
    result: SimResult
    efficiency: float
    measured: float | None = None
    run_id: str | None = None
    cores_bound: float | None = None

    @property
    def samples_per_s(self) -> float:
        """The simulated hosts' samples/s, no more than the emulating machine allows."""
        if self.cores_bound is None:
            return self.result.samples_per_s
        return min(self.result.samples_per_s, self.cores_bound)

    @property
    def bound_by_cores(self) -> bool:
        """Whether the emulating machine's cores, not the simulated hosts, set the pace."""
        return self.samples_per_s < self.result.samples_per_s

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if not self.measured:
            return None
        return self.samples_per_s / self.measured - 1.0


def predict(configs: list[RunConfig], costs: Costs, iterations: int) -> list[Prediction]:
    """Simulate each config with these costs."""
    return [_predicted(c, costs, iterations) for c in configs]


def predict_runs(calibrations: list[Calibration]) -> list[Prediction]:
    """Simulate each stored run from its own costs, beside what it measured."""
    out = []
    for cal in calibrations:
        p = _predicted(cal.config, cal.costs, cal.iterations)
        p.measured, p.run_id = cal.measured["samples_per_s"], cal.run_id
        p.cores_bound = cal.cores_bound
        out.append(p)
    return out


def _predicted(config: RunConfig, costs: Costs, iterations: int) -> Prediction:
    result = simulate(config, costs, iterations)
    one = simulate(_one_worker(config), costs, iterations).samples_per_s
    efficiency = result.samples_per_s / (config.workers * one) if one else 0.0
    return Prediction(config, result, efficiency)


def _one_worker(config: RunConfig) -> RunConfig:
    """The same run with one worker (its batch, its host), the base of speed-up."""
    values = config.to_dict()
    per_worker = config.batch_size // config.workers
    cluster = dict(values.get("cluster", {}))
    for key in ("hosts", "bandwidth", "cpu"):
        cluster.pop(key, None)
    if config.cluster.bandwidth:
        cluster["bandwidth"] = [config.cluster.bandwidth[-1]]
    if config.cluster.hosts:
        cluster["workers_per_host"] = 1
    values.update(workers=1, batch_size=per_worker, cluster=cluster)
    for key in ("servers", "slowdown", "min_workers"):  # min_workers: of the run's workers
        values.pop(key, None)
    return make_config(values)
