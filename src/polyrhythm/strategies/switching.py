"""When Strategy-Switch switches from its synchronous to its asynchronous strategy (004 ch. 4):
three rules, asked once before training and after every epoch, each answering whether to
switch now, with its score and why. Pure: no torch, no I/O; the switch strategy asks them in
a run and a simulator can ask the same objects. The switch is one-way: a rule is not asked
again once it has fired.

- `AtRule`: after a fixed share α of the epochs, ⌊α·epochs⌋ of them (004's static switch,
  α swept 10-90 %).
- `EmpiricalRule`: 004's ER-SS. After epoch k, with validation losses v,
  s = Σ_{i=0..w-1} |v(k-i) - v(k-i-1)| / (w · v(k-i-1)) × 100 %, the mean relative change
  of the last w changes; switch once s falls below the threshold (w = 5, 1 %). It needs
  w + 1 losses, so it never fires earlier.
- `StragglerRule`: once the synchronous phase's idleness (time waiting for peers / iteration
  time, over the last epoch) exceeds a threshold: waiting for slow workers then costs more
  than asynchrony would (Sync-Switch's online policy, Li et al., ICDCS 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """A rule's answer after an epoch: switch or not, its score (None where it has none
    yet), and one line saying why."""

    switch: bool
    score: float | None
    why: str


def loss_change(losses: Sequence[float], window: int) -> float | None:
    """004's s, in percent: the mean relative change over the last `window` changes of the
    validation loss; None with fewer than window + 1 losses."""
    if len(losses) < window + 1:
        return None
    recent = list(losses[-(window + 1):])
    return 100.0 * sum(abs(now - before) / before
                       for before, now in zip(recent, recent[1:], strict=False)) / window


class AtRule:
    """Switch once ⌊fraction · epochs⌋ epochs are done (before training if that is 0)."""

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

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def decide(self, epochs_done: int, losses: Sequence[float] = (),
               idleness: float | None = None) -> Decision:
        if idleness is None:
            return Decision(False, None, "no epoch measured yet")
        return Decision(idleness > self.threshold, idleness,
                        f"idleness {idleness:.1%} {'>' if idleness > self.threshold else '<='} "
                        f"{self.threshold:.1%}")
