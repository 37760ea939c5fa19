"""Statistics over seeds, against scipy: intervals, the paired t-test, Wilcoxon."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from ddl_dynamics.analysis.stats import (
    ALPHA,
    WILCOXON_MIN_PAIRS,
    Paired,
    mean_ci,
    paired_t_p,
    wilcoxon_p,
)

values = st.floats(-1e3, 1e3, allow_nan=False)
samples = st.lists(values, min_size=2, max_size=8).filter(lambda xs: max(xs) - min(xs) > 1e-3)
pairs = st.lists(st.tuples(values, values), min_size=2, max_size=12).filter(
    lambda ps: max(a - b for a, b in ps) - min(a - b for a, b in ps) > 1e-3)


@given(samples)
def test_mean_ci_matches_scipy_t_interval(xs):
    mean, half = mean_ci(xs)
    low, high = stats.t.interval(0.95, len(xs) - 1, loc=mean, scale=stats.sem(xs))
    assert mean == pytest.approx(sum(xs) / len(xs))
    assert half == pytest.approx((high - low) / 2, rel=1e-9, abs=1e-9)


@given(pairs)
def test_paired_test_matches_scipy_ttest_rel(ps):
    model = dict(enumerate(a for a, _ in ps))
    control = dict(enumerate(b for _, b in ps))
    paired = Paired.of(model, control)
    expected = stats.ttest_rel(list(model.values()), list(control.values()))
    assert paired.p == pytest.approx(expected.pvalue, rel=1e-6, abs=1e-12)
    low, high = expected.confidence_interval(0.95)
    assert paired.mean == pytest.approx((low + high) / 2, rel=1e-9, abs=1e-9)
    assert paired.ci == pytest.approx((high - low) / 2, rel=1e-6, abs=1e-9)
    # The interval and the test agree: the CI excludes 0 exactly when p < 0.05.
    if abs(paired.p - ALPHA) > 1e-9:
        assert (abs(paired.mean) > paired.ci) == (paired.p < ALPHA)


@given(pairs)
def test_wilcoxon_matches_scipy_from_six_pairs(ps):
    diffs = [a - b for a, b in ps]
    if len(diffs) < WILCOXON_MIN_PAIRS:
        assert wilcoxon_p(diffs) is None
    elif any(diffs):
        assert wilcoxon_p(diffs) == pytest.approx(stats.wilcoxon(diffs).pvalue, rel=1e-9)


def test_wilcoxon_exact_p_from_first_principles():
    # All n differences positive: only 1 of the 2ⁿ sign patterns is as extreme on each side.
    assert wilcoxon_p([0.1, 0.4, 0.2, 0.3, 0.5, 0.6]) == pytest.approx(2 / 2**6)
    assert wilcoxon_p([0.1, 0.4, 0.2, 0.3, 0.5]) is None  # p ≥ 2/2⁵ > 0.05: never reported


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy, constant input
def test_degenerate_differences():
    assert mean_ci([2.5]) == (2.5, None)
    assert paired_t_p([0.3]) is None
    assert paired_t_p([0.0, 0.0, 0.0]) is None  # no difference at all: no test
    assert paired_t_p([0.5, 0.5, 0.5]) == stats.ttest_rel([1.5] * 3, [1.0] * 3).pvalue == 0.0


def test_pairs_only_seeds_both_finished_and_tests_a_bound_with_one_sample():
    paired = Paired.of({0: 1.0, 1: 2.0, 3: 4.0}, {0: 0.5, 1: 1.0, 2: 9.0})
    assert paired.seeds == (0, 1) and paired.differences == (0.5, 1.0) and paired.n == 2
    model = {0: 1.1, 1: 1.05, 2: 1.2, 3: 1.08}
    bound = Paired.of(model, 0.95)
    assert bound.n == 4 and bound.mean == pytest.approx(sum(model.values()) / 4 - 0.95)
    assert bound.p == pytest.approx(stats.ttest_1samp(list(model.values()), 0.95).pvalue)


@pytest.mark.parametrize(("higher_is_better", "shift", "outcome"), [
    (False, -0.2, "better"), (False, 0.2, "worse"),  # MSE: lower is better
    (True, 0.2, "better"), (True, -0.2, "worse"),    # accuracy: higher is better
])
def test_outcome_follows_the_metric_direction(higher_is_better, shift, outcome):
    control = {0: 0.50, 1: 0.55, 2: 0.52}
    model = {s: v + shift + 0.01 * s for s, v in control.items()}
    assert Paired.of(model, control).outcome(higher_is_better) == outcome


def test_outcome_needs_three_pairs_and_significance():
    control = {0: 0.50, 1: 0.55, 2: 0.52}
    assert Paired.of({0: 0.9, 1: 0.95}, control).outcome(True) == "too few seeds"
    noisy = {0: 0.9, 1: 0.2, 2: 0.6}  # mean +0.04, spread far wider
    assert Paired.of(noisy, control).outcome(True) == "no difference"
