"""Statistics over seeds, against scipy and first principles: intervals, the paired t-test
and its zero-variance limit, the exact sign-flip and signed-rank tests, which test decides,
Holm and Tarone, the TOST and its interval, the detectable difference, and pairs with
failed seeds."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from ddl_dynamics.analysis.judge.stats import (
    ALPHA,
    PAIRED_T,
    SIGN_FLIP,
    SIGNED_RANK,
    T_MIN_PAIRS,
    Paired,
    detectable_difference,
    holm,
    holm_at,
    mean_ci,
    paired_t_p,
    paired_t_ps,
    sign_flip_floor,
    sign_flip_p,
    sign_flip_ps,
    sign_flip_tost_p,
    signed_rank_p,
    signed_rank_ps,
    tarone,
    tost_interval,
    tost_p,
    tost_ps,
)

values = st.floats(-1e3, 1e3, allow_nan=False)
samples = st.lists(values, min_size=2, max_size=8).filter(lambda xs: max(xs) - min(xs) > 1e-3)
pairs = st.lists(st.tuples(values, values), min_size=T_MIN_PAIRS, max_size=12).filter(
    lambda ps: max(a - b for a, b in ps) - min(a - b for a, b in ps) > 1e-3
)


def by_enumeration(differences):
    """The signed-rank p by listing every sign flip: the definition, ties and all."""
    d = np.array([x for x in differences if x])
    ranks = stats.rankdata(np.abs(d))
    observed = abs((np.sign(d) * ranks).sum())
    flips = [
        abs((np.array(signs) * ranks).sum()) for signs in itertools.product((-1, 1), repeat=len(d))
    ]
    return np.mean(np.array(flips) >= observed - 1e-9)


@given(samples)
def test_mean_ci_matches_scipy_t_interval(xs):
    mean, half = mean_ci(xs)
    low, high = stats.t.interval(0.95, len(xs) - 1, loc=mean, scale=stats.sem(xs))
    assert mean == pytest.approx(sum(xs) / len(xs))
    assert half == pytest.approx((high - low) / 2, rel=1e-9, abs=1e-9)


@given(pairs)
def test_the_paired_test_is_scipys_paired_t_test(ps):
    model = dict(enumerate(a for a, _ in ps))
    control = dict(enumerate(b for _, b in ps))
    paired = Paired.of(model, control, higher_is_better=True)
    scipy_t = stats.ttest_rel(list(model.values()), list(control.values()))
    assert paired.test == PAIRED_T and paired.floor == 0.0
    assert paired.p == pytest.approx(scipy_t.pvalue, rel=1e-6, abs=1e-12)
    low, high = scipy_t.confidence_interval(0.95)
    assert paired.mean == pytest.approx((low + high) / 2, rel=1e-9, abs=1e-9)
    assert paired.ci == pytest.approx((high - low) / 2, rel=1e-6, abs=1e-9)


def test_a_bound_is_tested_with_scipys_one_sample_t_test():
    rng = np.random.default_rng(11)
    for n in (6, 8, 20):
        values = 0.9 + 0.05 * rng.standard_normal(n)
        paired = Paired.of(dict(enumerate(values)), 0.95, True)
        assert paired.p == pytest.approx(stats.ttest_1samp(values, 0.95).pvalue, rel=1e-9)
    rows = rng.standard_normal((50, 7)) + 0.3
    assert paired_t_ps(rows) == pytest.approx(stats.ttest_1samp(rows, 0.0, axis=1).pvalue)


@given(
    st.lists(
        st.floats(-10, 10, allow_nan=False).filter(lambda x: abs(x) > 1e-6),
        min_size=1,
        max_size=10,
        unique=True,
    )
)
def test_signed_rank_matches_scipys_exact_wilcoxon_without_ties(diffs):
    if len({abs(d) for d in diffs}) == len(diffs):
        expected = stats.wilcoxon(diffs, method="exact").pvalue
        assert signed_rank_p(diffs) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "diffs", [[1, 1, 2, -2, 3, 3, 3, 0.5], [5, 5, 5, 5, -5, 0, 1], [-9, -9, 0.1, 0.2, 0.3]]
)
def test_signed_rank_is_exact_with_ties_and_zeros(diffs):
    assert signed_rank_p(diffs) == pytest.approx(by_enumeration(diffs), rel=1e-12)
    assert signed_rank_ps(np.array([diffs, np.negative(diffs)])) == pytest.approx(
        [by_enumeration(diffs)] * 2, rel=1e-12
    )


def test_differences_that_do_not_vary_take_the_t_statistics_limit():
    assert paired_t_p([0.5] * 8) == 0.0 and paired_t_p([-1e-9] * 3) == 0.0  # |t| → ∞
    assert paired_t_p([0.0] * 8) == 1.0  # no difference at all: nothing to reject
    assert paired_t_p([0.5]) is None  # one pair: no test
    assert tost_p([0.01] * 5, 0.05) == 0.0 and tost_p([0.0] * 5, 0.05) == 0.0  # inside
    assert tost_p([0.1] * 5, 0.05) == 1.0 and tost_p([0.05] * 5, 0.05) == 1.0  # not inside
    assert tost_interval([0.01] * 5) == (0.01, 0.01)


def by_sign_flips(differences, side=0):
    """The sign-flip p by listing every sign pattern: the definition."""
    d = np.array(differences, dtype=float)
    sums = np.array(
        [(np.array(signs) * d).sum() for signs in itertools.product((-1, 1), repeat=len(d))]
    )
    observed, slack = d.sum(), 1e-9 * np.abs(d).sum()
    hit = (
        np.abs(sums) >= abs(observed) - slack
        if side == 0
        else sums >= observed - slack
        if side > 0
        else sums <= observed + slack
    )
    return hit.mean()


@pytest.mark.parametrize(
    "diffs",
    [
        [0.3, -0.1, 0.2],
        [1, 1, 2, -2, 3, 3, 3, 0.5],
        [5, 5, 5, 5, -5, 0, 1],
        [-9, -9, 0.1, 0.2, 0.3],
    ],
)
def test_the_sign_flip_test_counts_every_sign_pattern(diffs):
    assert sign_flip_p(diffs) == pytest.approx(by_sign_flips(diffs), rel=1e-12)
    for side in (1, -1):
        assert sign_flip_ps(np.array([diffs]), side)[0] == pytest.approx(
            by_sign_flips(diffs, side), rel=1e-12
        )
    padded = np.array([[*diffs, np.nan], [*np.negative(diffs), np.nan]])
    assert sign_flip_ps(padded) == pytest.approx([by_sign_flips(diffs)] * 2, rel=1e-12)
    assert sign_flip_floor(diffs) == pytest.approx(by_sign_flips(np.abs(diffs)), rel=1e-12)
    # more patterns than one chunk sums at once: the same count
    many = np.random.default_rng(3).standard_normal(13) + 0.4
    assert sign_flip_p(many) == pytest.approx(by_sign_flips(many), rel=1e-12)


def test_three_seeds_at_one_against_0_999_are_decided_by_the_exact_test():
    """Before: the t statistic of constant differences is infinite, p = 0, a win after any
    family; the exact test's p is 2/2³ = 0.25, its floor."""
    paired = Paired.of(
        dict.fromkeys(range(3), 1.0), dict.fromkeys(range(3), 0.999), True, margin=0.01
    )
    assert paired.test == SIGN_FLIP and paired.p == paired.floor == 0.25
    # its equivalence test is exact too: every one of 3 differences inside, p = 1/2³
    assert paired.tost == paired.tost_floor == 0.125
    assert paired.interval == pytest.approx((0.001, 0.001))


@pytest.mark.parametrize(
    ("model", "test"),
    [
        ([0.9 + 0.01 * s for s in range(5)], SIGN_FLIP),  # five pairs: too few for normal tails
        ([0.9 + 0.01 * s for s in range(6)], PAIRED_T),  # six that vary
        ([0.9] * 8, SIGN_FLIP),  # eight that do not
        ([0.9 + 3e-8 * (-1) ** s for s in range(8)], SIGN_FLIP),  # nor up to float32 rounding
        ([0.9 + 1e-4 * (-1) ** s for s in range(8)], PAIRED_T),
    ],
)
def test_the_t_test_decides_from_six_pairs_whose_differences_vary(model, test):
    paired = Paired.of(dict(enumerate(model)), dict.fromkeys(range(len(model)), 0.6), True)
    assert paired.test == test
    differences = [m - 0.6 for m in model]
    expected = (
        stats.ttest_1samp(differences, 0.0).pvalue if test == PAIRED_T else 2 / 2 ** len(model)
    )
    assert paired.p == pytest.approx(expected, rel=1e-9)
    assert paired.floor == (0.0 if test == PAIRED_T else pytest.approx(expected))


def test_sign_flip_tost_is_the_larger_one_sided_exact_p():
    diffs = [0.002, -0.001, 0.004, 0.0]
    assert sign_flip_tost_p(diffs, 0.01) == pytest.approx(
        max(by_sign_flips(np.add(diffs, 0.01), 1), by_sign_flips(np.subtract(diffs, 0.01), -1))
    )
    assert sign_flip_tost_p([0.02] * 4, 0.01) == 1.0  # outside the margin on every seed
    assert sign_flip_tost_p([0.0], 0.01) is None and sign_flip_tost_p([0.0] * 3, None) is None


def test_tarone_leaves_out_the_tests_that_cannot_reach_their_holm_level():
    # 29 t-tests and one exact test at 8 seeds (floor 2/2⁸ = 0.0078): 0.05/29 lies below it
    assert tarone([0.0] * 29 + [2 / 2**8]) == pytest.approx(ALPHA / 29)
    # beside two tests it counts: 0.0078 < 0.05/3
    assert tarone([0.0, 0.0, 2 / 2**8]) == pytest.approx(ALPHA / 3)
    # three seeds' floor 0.25 never counts; K = 3 is the first with at most K floors below
    assert tarone([0.0, 0.0, 0.25, 0.0078]) == pytest.approx(ALPHA / 3)
    assert tarone([]) == ALPHA


@pytest.mark.parametrize("d", [0.0, 0.004, -0.3])
def test_the_tests_are_continuous_as_one_seed_moves_off_a_tie(d):
    """Every seed at difference ``d``, then one seed moved by less and less: the p-values
    approach the limit the tie itself gets (the t statistic grows without bound where d ≠ 0;
    the TOST's interval shrinks onto d inside the margin), so no tie switches a verdict."""
    margin = 0.01
    limit_p, limit_tost = paired_t_p([d] * 8), tost_p([d] * 8, margin)
    for eps in (1e-3, 1e-5, 1e-7):
        moved = [d + eps] + [d] * 7
        tost = tost_p(moved, margin)
        assert (tost < ALPHA) == (limit_tost < ALPHA) and abs(tost - limit_tost) < 0.02
        if d:
            assert paired_t_p(moved) < 1e-5 and limit_p == 0.0
        else:  # one seed off 0: t = 1 whatever its size, far from significant, as the tie
            assert paired_t_p(moved) == pytest.approx(2 * stats.t.sf(1, 7))
            assert limit_p == 1.0


def test_holm_adjusts_a_known_family_in_place():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → raised to 0.06
    assert holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == [] and holm([None]) == [None]


def test_tost_is_the_larger_of_two_one_sided_scipy_t_tests():
    rng = np.random.default_rng(5)
    for n, margin in ((3, 0.05), (8, 0.01), (8, 0.05), (20, 0.02)):
        for _ in range(20):
            diffs = 0.02 * rng.standard_normal(n) + rng.uniform(-0.05, 0.05)
            above = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
            below = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
            assert tost_p(diffs, margin) == pytest.approx(max(above, below), rel=1e-9)
    rows = 0.01 * rng.standard_normal((30, 6))
    rows[:, 5] = np.nan  # a seed a row does not have takes no part
    expected = [tost_p(r[:5], 0.02) for r in rows]
    assert tost_ps(rows, 0.02) == pytest.approx(expected)
    assert tost_p([0.01], 0.05) is None and tost_p([0.01, 0.02], None) is None


@given(
    st.lists(st.floats(-0.05, 0.05, allow_nan=False), min_size=2, max_size=10),
    st.floats(0.001, 0.05),
)
def test_tost_passes_exactly_when_its_90_percent_interval_lies_inside_the_margin(diffs, margin):
    low, high = tost_interval(diffs)
    mean, sem = np.mean(diffs), stats.sem(diffs)
    if sem > 0:
        assert (low + high) / 2 == pytest.approx(mean, abs=1e-12)
        assert high - low == pytest.approx(
            2 * stats.t.ppf(0.95, len(diffs) - 1) * sem, rel=1e-6, abs=1e-15
        )
    inside = -margin < low and high < margin
    if min(abs(low + margin), abs(high - margin)) > 1e-9:  # away from a rounding tie
        assert (tost_p(diffs, margin) < ALPHA) == inside


@pytest.mark.parametrize("n", [5, 6, 8])
def test_tost_keeps_its_level_at_the_margin(n):
    """Normal differences centred on the margin's edge, or beyond it (the mean −0.015
    against a 0.01 margin that a test of the median passed 6–17% of the time): equivalence
    is a false claim there, and the paired-t TOST makes it at most ALPHA of the time."""
    rng = np.random.default_rng(1)
    for centre, sd in ((0.01, 0.02), (-0.01, 0.005), (-0.015, 0.01)):
        draws = centre + sd * rng.standard_normal((20000, n))
        rate = np.mean(tost_ps(draws, 0.01) < ALPHA)
        assert rate <= ALPHA + 0.005


def test_the_detectable_difference_is_found_by_the_t_test_with_the_stated_power():
    sd, n, alpha = 0.2, 8, ALPHA
    effect = detectable_difference(sd, n, alpha)
    draws = np.random.default_rng(7).normal(effect, sd, (20000, n))
    assert np.mean(paired_t_ps(draws) < alpha) == pytest.approx(0.8, abs=0.01)
    assert detectable_difference(sd, 1, alpha) is None
    assert detectable_difference(0.0, 8, alpha) is None  # no spread: nothing to state
    # the t-test has no floor: a stricter level asks for a larger difference, never none
    assert detectable_difference(sd, 8, ALPHA / 40) > effect


def test_pairs_seeds_both_ran_and_tests_a_bound_with_one_sample():
    paired = Paired.of({0: 1.0, 1: 2.0, 3: 4.0}, {0: 0.5, 1: 1.0, 2: 9.0}, True)
    assert paired.seeds == (0, 1) and paired.differences == (0.5, 1.0) and paired.n == 2
    model = {0: 1.1, 1: 1.05, 2: 1.2, 3: 1.08}
    bound = Paired.of(model, 0.95, True)
    assert bound.n == 4 and bound.mean == pytest.approx(sum(model.values()) / 4 - 0.95)
    # four values, every one above the bound: the exact test's p is its floor, 2/2⁴
    assert bound.test == SIGN_FLIP and bound.p == bound.floor == 0.125


def test_a_failed_seed_ranks_as_its_sides_worst_outcome():
    control = {s: 0.5 for s in range(5)}
    # accuracy: three seeds better by a little, two that did not finish
    model = {0: 0.6, 1: 0.62, 2: 0.61, 3: None, 4: None}
    paired = Paired.of(model, control, higher_is_better=True, margin=0.01)
    assert paired.test == SIGNED_RANK and paired.failed == (3, 4)
    assert paired.n == 3 and paired.total == 5 and paired.tost is None
    # the failures take the largest ranks, against the model
    assert paired.p == pytest.approx(by_enumeration([0.1, 0.12, 0.11, -1, -1]))
    assert paired.better(True) is False  # ranks 4 + 5 against, 1 + 2 + 3 for
    # the same failures for the control count for the model; both failing is a tie
    theirs = Paired.of(
        {s: 0.6 for s in range(5)}, {0: 0.5, 1: None, 2: 0.5, 3: None, 4: None}, True
    )
    assert theirs.control_failed == (1, 3, 4) and theirs.better(True) is True
    both = Paired.of({0: None, 1: 0.6, 2: 0.7}, {0: None, 1: 0.5, 2: 0.5}, True)
    assert both.both_failed == (0,) and both.total == 3 and both.test == SIGN_FLIP
    # with MSE a failure is a large error: it still counts against the failing side
    mse = Paired.of({0: 0.1, 1: None, 2: None}, {0: 0.2, 1: 0.2, 2: 0.2}, False)
    assert mse.better(False) is False
    # one failure against two small wins balances: neither side is favoured
    assert (
        Paired.of({0: 0.1, 1: None, 2: 0.1}, {0: 0.2, 1: 0.2, 2: 0.2}, False).better(False) is None
    )


@pytest.mark.parametrize(
    ("higher_is_better", "shift", "better"),
    [
        (False, -0.2, True),
        (False, 0.2, False),  # MSE: lower is better
        (True, 0.2, True),
        (True, -0.2, False),  # accuracy: higher is better
    ],
)
def test_the_direction_follows_the_metric(higher_is_better, shift, better):
    control = {0: 0.50, 1: 0.55, 2: 0.52}
    model = {s: v + shift + 0.01 * s for s, v in control.items()}
    assert Paired.of(model, control, higher_is_better).better(higher_is_better) is better


def test_holm_at_adjusts_one_p_among_the_others_as_holm_does():
    rng = np.random.default_rng(2)
    for _ in range(200):
        ps = rng.uniform(0, 1, rng.integers(1, 8)) ** 3
        for j in range(len(ps)):
            assert holm_at(np.array([ps[j]]), np.delete(ps, j))[0] == pytest.approx(
                holm(list(ps))[j], abs=1e-12
            )
    # a p that ranks first among four at 0.9 takes the multiplier 5
    assert holm_at(np.array([0.012]), [0.9] * 4)[0] == pytest.approx(0.06)
