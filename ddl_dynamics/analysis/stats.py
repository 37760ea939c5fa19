"""Statistics over seeds: confidence intervals, paired tests, multiplicity, equivalence.

Every model of a task sees the same data and the same initial-weight stream for a given
seed, so two models are compared *paired*, seed by seed (:class:`Paired`). The tests are
small pure functions, checked against scipy: the paired t-test, the exact sign test, an
exact signed-rank test that lets a failed seed rank as its pair's worst outcome, the two
one-sided tests of equivalence (TOST), Holm's adjustment for the number of tests drawn, and
the smallest difference a test could have detected. Which test decides what, and how
p-values become words, is the rule book's (:mod:`.verdicts`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

#: Significance level of every verdict, after Holm's adjustment.
ALPHA = 0.05
#: Fewest pairs for the Wilcoxon signed-rank p shown beside the t-test: its exact two-sided
#: p cannot fall below 2 / 2ⁿ, which first drops under ALPHA at n = 6.
WILCOXON_MIN_PAIRS = 6
#: Power at which :func:`detectable_difference` states the smallest detectable effect.
POWER = 0.8


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided t confidence interval (None when n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sem


@dataclass(frozen=True)
class Estimate:
    """A figure over seeds: mean, 95% CI half-width (None for n = 1), seeds used."""

    mean: float | None = None
    ci: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Estimate:
        """Over the finite values among ``values`` (None, NaN and ∞ are left out)."""
        finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
        return cls(*mean_ci(finite), len(finite)) if finite else cls()


def paired_t_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the paired t-test on per-seed differences (``scipy.stats.ttest_rel``);
    None below 2 pairs or when the differences do not vary (the t statistic is then
    undefined: :func:`sign_test_p` decides)."""
    if len(differences) < 2 or (sd := statistics.stdev(differences)) == 0:
        return None
    t = statistics.fmean(differences) / (sd / math.sqrt(len(differences)))
    return float(2 * stats.t.sf(abs(t), len(differences) - 1))


def sign_test_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact sign test on the non-zero differences (None if all are 0):
    what identical differences on n seeds show, 2 / 2ⁿ at best, never 0."""
    nonzero = [d for d in differences if d]
    if not nonzero:
        return None
    return float(stats.binomtest(sum(d > 0 for d in nonzero), len(nonzero)).pvalue)


def signed_rank_sum(differences: Sequence[float]) -> float:
    """The sum of the signed ranks of ``|d|`` (ties averaged, zeros dropped)."""
    nonzero = np.array([d for d in differences if d], dtype=float)
    return float((np.sign(nonzero) * stats.rankdata(np.abs(nonzero))).sum()) if len(
        nonzero) else 0.0


def signed_rank_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact signed-rank test: the sum of the signed ranks of ``|d|``
    (ties averaged, zeros dropped) against its distribution over every sign flip, counted
    exactly. Exact with ties, unlike the normal approximation, so seeds that all failed
    the same way are handled."""
    nonzero = [d for d in differences if d]
    if not nonzero:
        return None
    doubled = np.rint(2 * stats.rankdata(np.abs(nonzero))).astype(int)  # ties give halves
    total = int(doubled.sum())
    counts = np.zeros(total + 1)  # sign flips by the doubled rank sum of the positives
    counts[0] = 1.0
    for rank in doubled:
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    observed = abs(2 * sum(r for r, d in zip(doubled, nonzero, strict=True) if d > 0) - total)
    extreme = np.abs(2 * np.arange(total + 1) - total) >= observed
    return float(min(1.0, counts[extreme].sum() / 2.0 ** len(nonzero)))


def tost_p(differences: Sequence[float], margin: float) -> float | None:
    """p of the paired two one-sided tests that the mean difference lies inside
    ``(−margin, margin)``: the larger of the two one-sided t-test p-values (None below 2
    pairs). Differences that do not vary are inside with the exact sign test's p, 2⁻ⁿ, when
    every one lies within the margin, else outside (p = 1)."""
    n = len(differences)
    if n < 2 or margin <= 0:
        return None
    sd = statistics.stdev(differences)
    if sd == 0:
        return 0.5**n if abs(differences[0]) < margin else 1.0
    mean, se = statistics.fmean(differences), sd / math.sqrt(n)
    above = stats.t.sf((mean + margin) / se, n - 1)  # H0: mean ≤ −margin
    below = stats.t.cdf((mean - margin) / se, n - 1)  # H0: mean ≥ margin
    return float(max(above, below))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: no test, left out and
    left None), in their order: the smallest is multiplied by the family's size, the next by
    one less, and so on, each at least the one before and at most 1."""
    drawn = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(drawn):
        running = max(running, min(1.0, (len(drawn) - rank) * p))
        adjusted[i] = running
    return adjusted


def detectable_difference(sd: float, n: int, alpha: float, power: float = POWER) -> float | None:
    """The smallest mean difference a two-sided paired t-test at level ``alpha`` detects
    with probability ``power`` over ``n`` pairs whose differences have deviation ``sd``
    (None below 2 pairs): what a test that found nothing could have found. Solved exactly
    on the noncentral t distribution."""
    if n < 2:
        return None
    df, critical = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(shift: float) -> float:
        below = np.nan_to_num(stats.nct.cdf(-critical, df, shift))  # ≈ 0 once shift is large
        return float(stats.nct.sf(critical, df, shift) + below - power)

    shift = optimize.brentq(shortfall, 0.0, 2 * (critical + 3))
    return float(shift * sd / math.sqrt(n))


@dataclass(frozen=True)
class Paired:
    """``model − control`` seed by seed, failures included.

    The control is another model's per-seed values or a constant (an analytic bound). A seed
    either side did not finish (value None) is never dropped: where one side failed, the
    pair counts as that side's worst outcome, ranked beyond every finished difference
    (``failed``: the seeds the model failed, ``control_failed``: the control's; a seed both
    failed is a tie). The deciding p is then the exact signed-rank test's; with no one-sided
    failure it is the paired t-test's over the finished pairs, or the exact sign test's where
    their differences do not vary. ``mean``, ``ci`` and ``sd`` describe the finished pairs
    only; ``tost`` is the equivalence p at ``margin`` (None with a one-sided failure: a row
    that fails is not equivalent to one that does not).
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float | None
    ci: float | None
    sd: float | None
    p: float | None
    test: str
    wilcoxon: float | None
    failed: tuple[int, ...] = ()
    control_failed: tuple[int, ...] = ()
    both_failed: tuple[int, ...] = ()
    margin: float | None = None
    tost: float | None = None
    #: The sign of the deciding test's statistic: > 0 where the model's values are higher.
    direction: float = 0.0

    @classmethod
    def of(cls, model: Mapping[int, float | None], control: Mapping[int, float | None] | float,
           higher_is_better: bool, margin: float | None = None) -> Paired:
        """Pair per-seed values (seed → value, None for a seed that did not finish) with
        the control's, over the seeds both ran."""
        if isinstance(control, Mapping):
            both = sorted(set(model) & set(control))
            sides = {s: (model[s], control[s]) for s in both}
        else:
            sides = {s: (v, float(control)) for s, v in sorted(model.items())}
        finished = {s: m - c for s, (m, c) in sides.items() if m is not None and c is not None}
        failed = tuple(s for s, (m, c) in sides.items() if m is None and c is not None)
        control_failed = tuple(s for s, (m, c) in sides.items() if c is None and m is not None)
        both_failed = tuple(s for s, (m, c) in sides.items() if m is None and c is None)
        diffs = tuple(finished.values())
        mean, ci = mean_ci(diffs) if diffs else (None, None)
        sd = statistics.stdev(diffs) if len(diffs) > 1 else None
        if failed or control_failed:
            # the worst outcome of the failing side: beyond every finished difference
            worst = 1 + 2 * max((abs(d) for d in diffs), default=1.0)
            against = -worst if higher_is_better else worst  # bad for the model
            ranked = [*diffs, *(against for _ in failed), *(-against for _ in control_failed)]
            p, test = signed_rank_p(ranked), "signed rank, failures last"
            direction = signed_rank_sum(ranked)
        elif sd == 0:
            p, test, direction = sign_test_p(diffs), "exact sign test", mean or 0.0
        else:
            p, test, direction = paired_t_p(diffs), "paired t", mean or 0.0
        wilcoxon = (float(stats.wilcoxon(diffs).pvalue)
                    if test == "paired t" and len(diffs) >= WILCOXON_MIN_PAIRS else None)
        tost = (tost_p(diffs, margin) if margin is not None and not (failed or control_failed)
                else None)
        return cls(tuple(finished), diffs, mean, ci, sd, p, test, wilcoxon, failed,
                   control_failed, both_failed, margin, tost, float(np.sign(direction)))

    @property
    def n(self) -> int:
        """Seeds both sides finished."""
        return len(self.seeds)

    @property
    def total(self) -> int:
        """Seeds compared, failures included."""
        return self.n + len(self.failed) + len(self.control_failed) + len(self.both_failed)

    def better(self, higher_is_better: bool) -> bool | None:
        """Whether the deciding test's statistic favours the model (a failure counting
        against its side), None when it favours neither."""
        return None if not self.direction else (self.direction > 0) == higher_is_better
