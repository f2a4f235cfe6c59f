"""The accuracy criterion: relative and absolute budgets, either metric direction."""

from __future__ import annotations

import pytest

from quantune import Criterion


@pytest.mark.parametrize(
    ("baseline", "candidate", "budget", "meets", "loss"),
    [
        (0.80, 0.80, 0.01, True, 0.0),
        (0.80, 0.796, 0.01, True, 0.005),  # lost 0.5% of 0.80
        (0.80, 0.78, 0.01, False, 0.025),  # lost 2.5%
        (0.80, 0.84, 0.01, True, -0.05),  # did better: negative loss
        (0.50, 0.40, 0.25, True, 0.2),
    ],
)
def test_relative_higher_is_better(baseline, candidate, budget, meets, loss):
    check = Criterion("relative", budget, higher_is_better=True).check(baseline, candidate)
    assert check.meets is meets
    assert check.loss == pytest.approx(loss)
    assert check.violation == pytest.approx(max(0.0, loss - budget), abs=1e-12)


@pytest.mark.parametrize(
    ("baseline", "candidate", "budget", "meets", "loss"),
    [
        (2.0, 2.0, 0.1, True, 0.0),
        (2.0, 2.1, 0.1, True, 0.05),  # 5% higher error
        (2.0, 2.5, 0.1, False, 0.25),
        (2.0, 1.0, 0.1, True, -0.5),  # lower error is a gain
    ],
)
def test_relative_lower_is_better(baseline, candidate, budget, meets, loss):
    check = Criterion("relative", budget, higher_is_better=False).check(baseline, candidate)
    assert check.meets is meets
    assert check.loss == pytest.approx(loss)


def test_relative_uses_the_baseline_magnitude_for_negative_baselines():
    # A score of -2.0 dropping to -2.2 (higher is better) lost 10% of its magnitude.
    check = Criterion("relative", 0.2, higher_is_better=True).check(-2.0, -2.2)
    assert check.loss == pytest.approx(0.1)
    assert check.meets


@pytest.mark.parametrize(
    ("higher", "baseline", "candidate", "meets", "loss"),
    [
        (True, 0.90, 0.85, True, 0.05),
        (True, 0.90, 0.70, False, 0.20),
        (True, 0.90, 0.95, True, -0.05),
        (False, 0.10, 0.15, True, 0.05),
        (False, 0.10, 0.30, False, 0.20),
        (False, 0.10, 0.05, True, -0.05),
    ],
)
def test_absolute(higher, baseline, candidate, meets, loss):
    check = Criterion("absolute", 0.1, higher_is_better=higher).check(baseline, candidate)
    assert check.meets is meets
    assert check.loss == pytest.approx(loss)
    assert check.violation == pytest.approx(max(0.0, loss - 0.1), abs=1e-12)


@pytest.mark.parametrize(
    ("kind", "higher", "baseline", "candidate", "budget"),
    [
        ("absolute", True, 0.9, 0.8, 0.1),
        ("absolute", False, 0.3, 0.4, 0.1),
        ("relative", True, 0.9, 0.891, 0.01),
        ("relative", True, 0.8, 0.6, 0.25),
        ("relative", False, 0.2, 0.21, 0.05),
        ("absolute", True, 1.0, 1.0, 0.0),
    ],
)
def test_loss_exactly_at_the_budget_meets(kind, higher, baseline, candidate, budget):
    check = Criterion(kind, budget, higher_is_better=higher).check(baseline, candidate)
    assert check.meets
    assert check.loss == pytest.approx(budget)


@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_just_over_the_budget_misses(kind):
    check = Criterion(kind, 0.1).check(1.0, 1.0 - 0.1 - 1e-6)
    assert not check.meets
    assert check.violation == pytest.approx(1e-6, rel=1e-3)


def test_zero_budget_only_accepts_no_loss():
    criterion = Criterion("absolute", 0.0)
    assert criterion.check(0.9, 0.9).meets
    assert criterion.check(0.9, 0.95).meets
    assert not criterion.check(0.9, 0.8999).meets


def test_violation_grows_with_the_miss():
    criterion = Criterion("absolute", 0.05)
    small = criterion.check(0.9, 0.8).violation
    large = criterion.check(0.9, 0.5).violation
    assert 0.0 < small < large
    assert small == pytest.approx(0.05)
    assert large == pytest.approx(0.35)


def test_violation_is_zero_whenever_the_criterion_is_met():
    check = Criterion("relative", 0.01).check(0.9, 0.891)  # 0.009 / 0.9 rounds to just above 0.01
    assert check.meets
    assert check.violation == 0.0


def test_describe_names_budget_and_direction():
    assert "1.00%" in Criterion("relative", 0.01).describe()
    assert "lower is better" in Criterion("absolute", 0.5, higher_is_better=False).describe()
