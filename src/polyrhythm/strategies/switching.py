"""When Strategy-Switch switches from its synchronous to its asynchronous strategy (the
Strategy-Switch thesis, ch. 4): three rules, asked once before training and after every epoch,
each answering whether to switch now, with its score and why. Pure: no torch, no I/O; the
switch strategy asks them in a run and a simulator can ask the same objects. The switch is
one-way: a rule is not asked again once it has fired.

- `AtRule`: after a fixed share α of the epochs, ⌊α·epochs⌋ of them (the thesis's static switch,
  α swept 10-90 %).
- `EmpiricalRule`: the thesis's ER-SS. After epoch k, with validation losses v,
  s = Σ_{i=0..w-1} |v(k-i) - v(k-i-1)| / (w · v(k-i-1)) × 100 %, the mean relative change
  of the last w changes; switch once s falls below the threshold (w = 5, 1 %). It needs
  w + 1 losses, so it never fires earlier.
- `StragglerRule`: once the synchronous phase's idleness (time waiting for peers / iteration
  time, over the last epoch, of the most idle worker) exceeds a threshold: waiting for slow
  workers then costs more than asynchrony would (Sync-Switch's online policy, Li et al.,
  ICDCS 2021).

The `switch` strategy is declared here too; its worker side is strategies/switch_worker.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyrhythm.settings import Param, at_least, one_of, positive, within
from polyrhythm.strategies.spec import (
    COLLECTIVE,
    PARAMETER_SERVER,
    STRATEGIES,
    SWITCHING,
    StrategySpec,
)


@dataclass(frozen=True)
class Decision:
    """A rule's answer after an epoch: switch or not, its score (None where it has none
    yet), and one line saying why."""

    switch: bool
    score: float | None
    why: str


def loss_change(losses: Sequence[float], window: int) -> float | None:
    """The thesis's s, in percent: the mean relative change over the last `window` changes of the
    validation loss; None with fewer than window + 1 losses."""
    if len(losses) < window + 1:
        return None
    recent = list(losses[-(window + 1):])
    return 100.0 * sum(abs(now - before) / before
                       for before, now in zip(recent, recent[1:], strict=False)) / window


class AtRule:
    """Switch once ⌊fraction · epochs⌋ epochs are done (before training if that is 0)."""

    needs = ""  # what the run must measure for it: nothing

    def __init__(self, fraction: float, epochs: int) -> None:
        self.epoch = math.floor(fraction * epochs)

    def decide(self, epochs_done: int, losses: Sequence[float] = (),
               idleness: float | None = None) -> Decision:
        switch = epochs_done >= self.epoch
        return Decision(switch, float(epochs_done),
                        f"{epochs_done} of the {self.epoch} epochs before the switch done")


class EmpiricalRule:
    """Switch once the validation loss changes by less than `threshold` percent on average
    over the last `window` changes."""

    needs = "validation loss"

    def __init__(self, window: int = 5, threshold: float = 1.0) -> None:
        self.window, self.threshold = window, threshold

    def decide(self, epochs_done: int, losses: Sequence[float] = (),
               idleness: float | None = None) -> Decision:
        s = loss_change(losses, self.window)
        if s is None:
            return Decision(False, None, f"{len(losses)} validation losses, the rule needs "
                                         f"{self.window + 1}")
        return Decision(s < self.threshold, s,
                        f"loss change s = {s:.3f} % {'<' if s < self.threshold else '>='} "
                        f"{self.threshold:g} %")


class StragglerRule:
    """Switch once the last epoch's idleness exceeds `threshold` (a share, 0-1)."""

    needs = "idleness"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def decide(self, epochs_done: int, losses: Sequence[float] = (),
               idleness: float | None = None) -> Decision:
        if idleness is None:
            return Decision(False, None, "no epoch measured yet")
        return Decision(idleness > self.threshold, idleness,
                        f"idleness {idleness:.1%} {'>' if idleness > self.threshold else '<='} "
                        f"{self.threshold:.1%}")


RULES = {"at": lambda s, epochs: AtRule(s.at, epochs),
         "empirical": lambda s, epochs: EmpiricalRule(s.window, s.loss_threshold),
         "straggler": lambda s, epochs: StragglerRule(s.idleness_threshold)}


def rule_of(settings: Any, epochs: int) -> AtRule | EmpiricalRule | StragglerRule:
    """The rule a `switch` strategy's settings choose, for a run of `epochs` epochs."""
    return RULES[settings.rule](settings, epochs)


# The most idle of 4 all-reduce workers on mnist5k here (2 cores), per epoch: 0.43-0.51 with
# none slowed, 0.59-0.63 with one slowed 2x, 0.70-0.72 with one slowed 3x (README,
# "Strategy-Switch"); the default lies between none and 2x.
IDLENESS_THRESHOLD = 0.55


def _halves(settings: Any, run: Any) -> str | None:
    first, then = STRATEGIES[settings["from"].name], STRATEGIES[settings.to.name]
    if first.family != COLLECTIVE:
        collective = ", ".join(s.name for s in STRATEGIES.values() if s.family == COLLECTIVE)
        return f"switch's from must be a collective strategy ({collective}), got {first.name!r}"
    if then.family != PARAMETER_SERVER:
        return f"switch's to must be a parameter-server strategy, got {then.name!r}"
    return None


def _switch_point(settings: Any, run: Any) -> str | None:
    """Rule at with α > 0 must leave some epochs to the first strategy: ⌊α·epochs⌋ = 0
    would switch before training, which only α = 0 asks for. (With α < 1, ⌊α·epochs⌋ is
    below epochs, in floating point too, so the switch always comes before the end; α = 1
    never switches, on purpose.)"""
    alpha, epochs = settings.at, run.epochs
    if settings.rule != "at" or alpha <= 0 or math.floor(alpha * epochs) > 0:
        return None
    needed = math.ceil(1 / alpha) if alpha >= 1e-6 else None
    while needed is not None and math.floor(alpha * needed) < 1:
        needed += 1  # 1/α rounded up may still fall short by a rounding error
    more = f"at least {needed} epochs" if needed else "more epochs"
    if epochs > 1:  # with one epoch, no α < 1 leaves it to the first strategy
        more += " or a larger --at"
    return (f"switch at {alpha:g} of {epochs} epoch{'s' * (epochs != 1)} is after "
            f"⌊{alpha * epochs:g}⌋ = 0 epochs, so {settings['from'].name} would never run: "
            f"give {more} (--at 0 switches before training on purpose)")


def _check(settings: Any, run: Any) -> str | None:
    return _halves(settings, run) or _switch_point(settings, run)


def _to_given(given: Mapping[str, Any]) -> tuple[StrategySpec, Mapping[str, Any]]:
    """The `to` half as given: its declaration and its settings."""
    to = given.get("to", "asp")
    name, settings = (to, {}) if isinstance(to, str) else (to.get("name"), to)
    return STRATEGIES[name], settings


SWITCH = StrategySpec(
    "switch", "Strategy-Switch: a collective strategy first, then for good a parameter "
    "server's, when the rule says so", source="the Strategy-Switch thesis, ch. 4; after "
    "Sync-Switch, Li et al., ICDCS 2021", family=SWITCHING,
    # Until the switch its workers meet only in the collective half's sums (they regroup);
    # then its servers go on without a lost worker as a parameter server's do.
    worker="polyrhythm.strategies.switch_worker:SwitchWorker", updates_from=None,
    regroups=True, params=(
        Param("from", str, "the strategy before the switch (a collective one)", "allreduce",
              section="strategy"),
        Param("to", str, "the strategy after the switch (a parameter-server one)", "asp",
              section="strategy"),
        Param("rule", str, "when to switch: at (a share of the epochs), empirical (the "
              "validation loss flattens) or straggler (workers wait for a slow one)", "at",
              rule=one_of(*RULES)),
        Param("at", float, "rule at: switch after ⌊α·epochs⌋ epochs", 0.5,
              rule=within(0, 1), metavar="α"),
        Param("window", int, "rule empirical: loss changes averaged (w; it needs w + 1 "
              "validation losses)", 5, rule=at_least(1)),
        Param("loss_threshold", float, "rule empirical: switch when the loss changes by less "
              "than this many percent on average", 1.0, rule=positive(), metavar="PERCENT"),
        Param("idleness_threshold", float, "rule straggler: switch when the most idle worker "
              "waited for peers more than this share of the last epoch", IDLENESS_THRESHOLD,
              rule=within(0, 1, low_open=True, high_open=True))),
    check=_check,
    policy=lambda s, n: STRATEGIES[s.to.name].policy(s.to, n),
    whole_gradient=lambda given: _to_given(given)[0].whole_gradient(_to_given(given)[1]))
