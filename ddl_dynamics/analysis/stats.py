"""Statistics over seeds: confidence intervals, paired tests, multiplicity, equivalence.

Every model of a task sees the same data and the same initial-weight stream for a given
seed, so two models are compared *paired*, seed by seed (:class:`Paired`). One rule decides
every test, ties and ceilings included: the exact sign-flip permutation test
(:func:`sign_flip_p`). Under no difference each seed's difference is as likely to have
either sign, so the observed statistic is ranked among its values over every sign pattern
(all 2ⁿ up to :data:`EXACT_PAIRS` pairs, a fixed-seed Monte Carlo sample beyond). The
difference test flips the mean difference (the signed ranks where a failed seed has only an
order, :func:`signed_rank_p`); the equivalence test (TOST, :func:`tost_p`) flips the
differences shifted by the margin, and its 90% interval (:func:`tost_interval`) is the
same test inverted. The tests need no normality and no special case: identical
differences are one more set of values. Their price is a floor: no p falls below 2 / 2ⁿ
(:func:`p_floor`). Holm's adjustment (:func:`holm`) and the smallest difference a test
could detect (:func:`detectable_difference`) complete the set; which test decides what, and
how p-values become words, is the rule book's (:mod:`.verdicts`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

#: Significance level of every verdict, after Holm's adjustment.
ALPHA = 0.05
#: Power at which :func:`detectable_difference` states the smallest detectable effect.
POWER = 0.8
#: Most pairs whose 2ⁿ sign patterns are enumerated; beyond, :data:`MONTE_CARLO` patterns.
EXACT_PAIRS = 16
#: Random sign patterns (fixed seed) drawn beyond :data:`EXACT_PAIRS`, the observed one
#: added, so that a p is never 0.
MONTE_CARLO = 2**14
#: Simulated samples behind :func:`detectable_difference`.
SIMULATIONS = 1000


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided t confidence interval (None when n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sem


def finite(value: object) -> bool:
    """Whether a metric is a finite number (None, NaN and ∞ are not)."""
    return isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True)
class Estimate:
    """A figure over seeds: mean, 95% CI half-width (None for n = 1), seeds used."""

    mean: float | None = None
    ci: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Estimate:
        """Over the finite values among ``values`` (None, NaN and ∞ are left out)."""
        kept = [float(v) for v in values if finite(v)]
        return cls(*mean_ci(kept), len(kept)) if kept else cls()


@lru_cache(maxsize=64)
def sign_patterns(n: int, limit: int = EXACT_PAIRS) -> np.ndarray:
    """The sign patterns of ``n`` pairs, ``(patterns, n)`` of ±1: all 2ⁿ up to ``limit``
    pairs, else the observed pattern (all +1) and :data:`MONTE_CARLO` random ones."""
    if n <= limit:
        grid = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    else:
        drawn = np.random.default_rng(0).integers(0, 2, (MONTE_CARLO, n))
        grid = np.vstack([np.zeros((1, n), dtype=int), drawn])
    patterns = 1.0 - 2.0 * grid
    patterns.setflags(write=False)
    return patterns


def _at_least(flipped: np.ndarray, observed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``flipped ≥ observed`` up to rounding (a sum of the same terms in another order)."""
    return flipped >= observed - 1e-9 * scale


def sign_flip_ps(values: np.ndarray, patterns: np.ndarray | None = None) -> np.ndarray:
    """Two-sided sign-flip p of the mean of each row of ``values`` ``(R, n)``: the share of
    sign patterns whose |sum| reaches the observed one. 1 for an empty or all-zero row."""
    values = np.atleast_2d(np.asarray(values, dtype=float))
    if values.shape[1] == 0:
        return np.ones(len(values))
    patterns = sign_patterns(values.shape[1]) if patterns is None else patterns
    out = np.empty(len(values))
    step = max(1, 2**20 // len(patterns))  # rows per block: a million products at once
    for start in range(0, len(values), step):
        block = values[start:start + step]
        flipped = block @ patterns.T
        np.abs(flipped, out=flipped)
        observed = np.abs(block.sum(axis=1, keepdims=True))
        scale = np.abs(block).sum(axis=1, keepdims=True)
        out[start:start + step] = _at_least(flipped, observed, scale).mean(axis=1)
    return out


def sign_flip_p(values: Sequence[float]) -> float:
    """Two-sided p of the exact sign-flip test that ``values`` (paired differences) have
    mean 0; the same for ties, zeros and identical values (2 / 2ⁿ at best, never 0)."""
    return float(sign_flip_ps(np.array([values], dtype=float).reshape(1, -1))[0])


def p_floor(values: Sequence[float]) -> float:
    """The smallest p :func:`sign_flip_p` can give over these magnitudes: where every value
    has the same sign. A test whose floor is not below the level can never reject."""
    return sign_flip_p([abs(v) for v in values])


def signed_ranks(values: np.ndarray) -> np.ndarray:
    """Each row's values replaced by their signed ranks of ``|value|`` (ties averaged,
    zeros ranked 0 and left out of the ranking)."""
    values = np.atleast_2d(np.asarray(values, dtype=float))
    if values.shape[1] == 0:
        return values
    size = np.abs(values)
    zeros = (size == 0).sum(axis=1, keepdims=True)
    ranks = stats.rankdata(size, axis=1) - zeros  # zeros rank first: shift them out
    return np.where(size == 0, 0.0, np.sign(values) * ranks)


def signed_rank_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact signed-rank test (None if every difference is 0): the
    sign-flip test (:func:`sign_flip_p`) on the signed ranks, exact with ties and zeros,
    for values that have an order but no size, such as a failed seed."""
    if not np.any(differences):
        return None
    return sign_flip_p(signed_ranks(np.array([differences], dtype=float).reshape(1, -1))[0])


def one_sided_ps(shifted: np.ndarray) -> np.ndarray:
    """One-sided sign-flip p, per row of ``shifted`` ``(R, n)``, that its mean is ≤ 0,
    against a mean above 0 (a zero entry takes no part)."""
    shifted = np.atleast_2d(np.asarray(shifted, dtype=float))
    patterns = sign_patterns(shifted.shape[1])
    observed = shifted.sum(axis=1, keepdims=True)
    scale = np.abs(shifted).sum(axis=1, keepdims=True)
    return _at_least(shifted @ patterns.T, observed, scale).mean(axis=1)


def tost_ps(differences: np.ndarray, margin: float) -> np.ndarray:
    """:func:`tost_p` per row of ``differences`` ``(R, n)``; NaN entries take no part."""
    d = np.atleast_2d(np.asarray(differences, dtype=float))
    kept = ~np.isnan(d)
    low = np.where(kept, d + margin, 0.0)
    high = np.where(kept, margin - d, 0.0)
    return np.maximum(one_sided_ps(low), one_sided_ps(high))


def tost_p(differences: Sequence[float], margin: float | None) -> float | None:
    """p of the two one-sided sign-flip tests that the mean difference lies inside
    ``(−margin, margin)``: the larger of the tests of ``d + margin`` above 0 and of
    ``margin − d`` above 0 (None without a pair or a margin). Identical differences are no
    special case: a shared ceiling on n seeds gives 2⁻ⁿ. The test assumes, as every
    sign-flip test does, differences spread symmetrically about their mean."""
    if len(differences) == 0 or margin is None or margin <= 0:
        return None
    return float(tost_ps(np.array([differences], dtype=float).reshape(1, -1), margin)[0])


def tost_interval(differences: Sequence[float],
                  alpha: float = ALPHA) -> tuple[float, float] | None:
    """The ``1 − 2·alpha`` interval (90% at the default) of the mean difference that the
    TOST inverts: the means it does not reject. :func:`tost_p` is below ``alpha`` exactly
    when this interval lies inside the margin. Its bounds are the k-th smallest and largest
    means over the subsets a sign pattern flips, k = ⌊alpha · patterns⌋; unbounded where
    k = 0 (too few pairs for the level). None without a pair."""
    if len(differences) == 0:
        return None
    d = np.asarray(differences, dtype=float)
    patterns = sign_patterns(len(d))
    flipped = patterns < 0
    sizes = flipped.sum(axis=1)
    means = np.sort((flipped @ d)[sizes > 0] / sizes[sizes > 0])
    k = math.floor(alpha * len(patterns))
    if k == 0:
        return -math.inf, math.inf
    return float(means[k - 1]), float(means[-k])


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: no test, left out and
    left None), in their order: the smallest is multiplied by the family's size, the next by
    one less, and so on, each at least the one before and at most 1. A NaN is a bug
    upstream, never a p: it is refused."""
    if any(p is not None and not (isinstance(p, int | float) and 0 <= p <= 1)
           for p in pvalues):
        raise ValueError(f"holm needs p-values in [0, 1] or None, got {list(pvalues)}")
    drawn = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(drawn):
        running = max(running, min(1.0, (len(drawn) - rank) * p))
        adjusted[i] = running
    return adjusted


@lru_cache(maxsize=256)
def _standard_detectable(n: int, alpha: float, power: float) -> float | None:
    """The detectable mean difference of :func:`detectable_difference` in units of the
    differences' deviation (the test is scale-free), by simulation with a fixed seed."""
    if p_floor([1.0] * n) >= alpha:
        return None
    z = np.random.default_rng(0).standard_normal((SIMULATIONS, n))
    # a Monte Carlo p (the observed pattern and 4,096 drawn) suffices to estimate power
    patterns = sign_patterns(n, limit=12)[:4097]

    def hits(shift: float) -> float:
        return float((sign_flip_ps(z + shift, patterns) < alpha).mean())

    high = 1.0
    while hits(high) < power:
        high *= 2
        if high > 1e3:
            return None
    low = 0.0
    for _ in range(12):  # finer than the simulation's own noise
        middle = (low + high) / 2
        low, high = (middle, high) if hits(middle) < power else (low, middle)
    return high


def detectable_difference(sd: float, n: int, alpha: float, power: float = POWER) -> float | None:
    """The smallest mean difference the two-sided sign-flip test at level ``alpha`` detects
    with probability ``power`` over ``n`` pairs whose differences are normal with deviation
    ``sd``: what a test that found nothing could have found. None where the test cannot
    reach ``alpha`` at this n at all (2 / 2ⁿ ≥ alpha)."""
    if n < 2 or not sd > 0:
        return None
    shift = _standard_detectable(n, alpha, power)
    return None if shift is None else shift * sd


@dataclass(frozen=True)
class Paired:
    """``model − control`` seed by seed, failures included.

    The control is another model's per-seed values or a constant (an analytic bound). A seed
    either side did not finish (value None, or a non-finite metric) is never dropped: where
    one side failed, the pair counts as that side's worst outcome, ranked beyond every
    finished difference (``failed``: the seeds the model failed, ``control_failed``: the
    control's; a seed both failed is a tie). The deciding p is the sign-flip test's
    (:func:`sign_flip_p`): on the finished differences, or, with a one-sided failure, on
    their signed ranks (:func:`signed_rank_p`). ``mean``, ``ci`` and ``sd`` describe the
    finished pairs only; ``tost`` is the equivalence p at ``margin`` and ``interval`` its
    90% interval (None with a one-sided failure: a row that fails is not equivalent to one
    that does not). Seeds only one side ran are not compared, and listed (``only_model``,
    ``only_control``).
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float | None
    ci: float | None
    sd: float | None
    p: float | None
    test: str
    failed: tuple[int, ...] = ()
    control_failed: tuple[int, ...] = ()
    both_failed: tuple[int, ...] = ()
    margin: float | None = None
    tost: float | None = None
    #: The sign of the deciding test's statistic: > 0 where the model's values are higher.
    direction: float = 0.0
    #: The TOST's 90% interval of the mean difference.
    interval: tuple[float, float] | None = None
    #: The smallest p the deciding test could give over these seeds (:func:`p_floor`).
    floor: float = 1.0
    only_model: tuple[int, ...] = ()
    only_control: tuple[int, ...] = ()
    #: Every seed both sides ran: ``(seed, model value, control value)``, None for a failure.
    pairs: tuple[tuple[int, float | None, float | None], ...] = ()

    @classmethod
    def of(cls, model: Mapping[int, float | None], control: Mapping[int, float | None] | float,
           higher_is_better: bool, margin: float | None = None) -> Paired:
        """Pair per-seed values (seed → value, None for a seed that did not finish) with
        the control's, over the seeds both ran."""
        if isinstance(control, Mapping):
            both = sorted(set(model) & set(control))
            sides = {s: (model[s], control[s]) for s in both}
            only = (tuple(sorted(set(model) - set(control))),
                    tuple(sorted(set(control) - set(model))))
        else:
            sides = {s: (v, float(control)) for s, v in sorted(model.items())}
            only = ((), ())
        sides = {s: tuple(float(v) if finite(v) else None for v in pair)
                 for s, pair in sides.items()}
        pairs = tuple((s, m, c) for s, (m, c) in sides.items())
        deciding, test, diffs = decisive(pairs, higher_is_better)
        finished = tuple(s for s, m, c in pairs if m is not None and c is not None)
        failed = tuple(s for s, m, c in pairs if m is None and c is not None)
        control_failed = tuple(s for s, m, c in pairs if c is None and m is not None)
        both_failed = tuple(s for s, m, c in pairs if m is None and c is None)
        mean, ci = mean_ci(diffs) if diffs else (None, None)
        sd = statistics.stdev(diffs) if len(diffs) > 1 else None
        p = sign_flip_p(deciding) if deciding else None
        one_sided = bool(failed or control_failed)
        tost = None if one_sided or margin is None else tost_p(diffs, margin)
        interval = None if one_sided or margin is None else tost_interval(diffs)
        return cls(finished, tuple(diffs), mean, ci, sd, p, test, failed, control_failed,
                   both_failed, margin, tost, float(np.sign(sum(deciding))), interval,
                   p_floor(deciding) if deciding else 1.0, *only, pairs)

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


#: The deciding tests, as :attr:`Paired.test` names them.
SIGN_FLIP, SIGNED_RANK = "sign flip", "signed rank, failures last"


def failure_value(differences: Sequence[float], higher_is_better: bool) -> float:
    """The difference a seed the model failed counts as: beyond every finished difference,
    on the bad side for the model (the control's failure counts as its negative)."""
    worst = 1 + 2 * max((abs(d) for d in differences), default=1.0)
    return -worst if higher_is_better else worst


def decisive(pairs: Sequence[tuple[int, float | None, float | None]],
             higher_is_better: bool) -> tuple[list[float], str, list[float]]:
    """The values the deciding test flips, its name and the finished differences, from
    ``(seed, model, control)`` pairs: the differences, or with a one-sided failure their
    signed ranks, each failure beyond every finished difference against its side."""
    diffs = [m - c for _, m, c in pairs if m is not None and c is not None]
    failed = sum(m is None and c is not None for _, m, c in pairs)
    control_failed = sum(c is None and m is not None for _, m, c in pairs)
    if not (failed or control_failed):
        return diffs, SIGN_FLIP, diffs
    against = failure_value(diffs, higher_is_better)
    ranked = [*diffs, *(against for _ in range(failed)),
              *(-against for _ in range(control_failed))]
    return list(signed_ranks(np.array([ranked]))[0]), SIGNED_RANK, diffs
