"""Strategy-Switch's rules (strategies/switching.py): pure, tested without processes."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyrhythm.strategies.switching import AtRule, EmpiricalRule, StragglerRule, loss_change


def test_the_empirical_rule_on_the_theses_worked_example():
    falling = [0.500, 0.450, 0.420, 0.415, 0.413, 0.412]
    flat = [0.4000, 0.3998, 0.3997, 0.3996, 0.3995, 0.3994]
    assert loss_change(falling, 5) == pytest.approx(3.72, abs=0.005)
    assert loss_change(flat, 5) == pytest.approx(0.03, abs=0.005)
    rule = EmpiricalRule(window=5, threshold=1.0)
    assert not rule.decide(6, falling).switch
    decision = rule.decide(6, flat)
    assert decision.switch and decision.score == pytest.approx(0.03, abs=0.005)
    assert "0.030 % < 1 %" in decision.why


def test_the_empirical_rule_reads_only_the_last_window():
    # An early drop no longer counts once w newer changes exist.
    losses = [2.0, 0.5] + [0.4] * 6
    assert loss_change(losses, 5) == 0.0
    assert loss_change(losses[:-1], 5) == pytest.approx(100 * (0.1 / 0.5) / 5)


@given(st.lists(st.floats(0.01, 10.0), max_size=12), st.integers(1, 6),
       st.floats(0.0, 1000.0))
def test_the_empirical_rule_never_fires_with_fewer_than_window_plus_one_losses(
        losses, window, threshold):
    decision = EmpiricalRule(window, threshold).decide(len(losses), losses)
    if len(losses) < window + 1:
        assert not decision.switch and decision.score is None


@given(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 60))
def test_at_switches_first_at_floor_of_its_share_of_the_epochs(fraction, epochs):
    rule = AtRule(fraction, epochs)
    first = next(k for k in range(epochs + 1) if rule.decide(k).switch)
    assert first == math.floor(fraction * epochs)


def test_the_straggler_rule_waits_for_a_measured_epoch_then_compares_idleness():
    rule = StragglerRule(0.25)
    assert not rule.decide(0).switch and rule.decide(0).score is None
    assert not rule.decide(1, idleness=0.2).switch
    fired = rule.decide(2, idleness=0.4)
    assert fired.switch and fired.score == 0.4 and "40.0% > 25.0%" in fired.why
