"""Statistics over seeds: confidence intervals, paired tests, multiplicity, equivalence.

Every model of a task sees the same data and the same initial-weight stream for a given
seed, so two models are compared *paired*, seed by seed (`Paired`). Which test decides a
mean difference depends on what the seeds can carry:

- the paired t-test (`paired_t_p`), and for equivalence the paired-t TOST (`tost_p`, the
  two one-sided t-tests; equivalently its 90% t interval, `tost_interval`, inside the
  margin), from `T_MIN_PAIRS` finished pairs on, where the differences vary beyond
  rounding (`ROUNDING`): its p has no floor, which a family of tests needs, but it rests
  on normal tails;
- the exact sign-flip test (`sign_flip_p`, and `sign_flip_tost_p` for equivalence) over
  fewer pairs, or over differences that do not vary (a t statistic over constant
  differences is infinite, and its p of 0 would survive any family): every one of the 2ⁿ
  sign patterns counted, so its p cannot fall below its floor, 2/2ⁿ;
- the exact signed-rank test (`signed_rank_p`) where a seed failed, a value with an
  order but no size.

A test whose floor cannot reach its Holm level does not count in the family (`tarone`).
Holm's adjustment (`holm`) and the smallest difference a test could detect
(`detectable_difference`) complete the set; how p-values become words is the rule book's
(`verdicts`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeGuard

import numpy as np
from scipy import optimize, stats

#: Significance level of every verdict, after Holm's adjustment.
ALPHA = 0.05
#: Power at which `detectable_difference` states the smallest detectable effect.
POWER = 0.8
#: Fewest finished pairs the paired t-test decides over: below, its normal tails are not
#: to be trusted, and the exact sign-flip test decides.
T_MIN_PAIRS = 6
#: The rounding unit of a metric, relative to the largest value compared: a float32 metric
#: carries ~1e-7 of its value in rounding, so differences that agree to this unit do not
#: vary, and a t statistic over them would measure rounding.
ROUNDING = 1e-6
#: Sign patterns the exact sign-flip test sums at once (memory, not precision).
_PATTERNS = 4096


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided t confidence interval (None when n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sem


def finite(value: object) -> TypeGuard[float]:
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


def _moments(values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row of ``values`` ``(R, n)`` (NaN: no value): count, mean, standard error, and
    whether the row does not vary (then its mean is its one value, exactly)."""
    kept = ~np.isnan(values)
    n = kept.sum(axis=1)
    low = np.where(kept, values, np.inf).min(axis=1, initial=np.inf)
    high = np.where(kept, values, -np.inf).max(axis=1, initial=-np.inf)
    mean = np.where(kept, values, 0.0).sum(axis=1) / np.maximum(n, 1)
    squares = (np.where(kept, values - mean[:, None], 0.0) ** 2).sum(axis=1)
    se = np.sqrt(squares / np.maximum(n - 1, 1) / np.maximum(n, 1))
    flat = (low == high) | (se == 0)
    return n, np.where(low == high, low, mean), np.where(flat, 1.0, se), flat


def paired_t_ps(differences: np.ndarray) -> np.ndarray:
    """`paired_t_p` per row of ``differences`` ``(R, n)``; NaN entries take no part,
    and a row with fewer than 2 values has no test (NaN)."""
    n, mean, se, flat = _moments(np.atleast_2d(np.asarray(differences, dtype=float)))
    df = np.maximum(n - 1, 1)
    p = np.where(flat, np.where(mean != 0, 0.0, 1.0), 2 * stats.t.sf(np.abs(mean / se), df))
    return np.where(n >= 2, p, np.nan)


def paired_t_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the paired t-test that the differences have mean 0 (the one-sample
    t-test on the differences, ``scipy.stats.ttest_rel``); None below 2 pairs. Differences
    that do not vary take the t statistic's limit: p = 0 where they are not 0, else 1."""
    if len(differences) < 2:
        return None
    return float(paired_t_ps(np.array([differences], dtype=float).reshape(1, -1))[0])


def tost_ps(differences: np.ndarray, margin: float) -> np.ndarray:
    """`tost_p` per row of ``differences`` ``(R, n)``; NaN entries take no part, and
    a row with fewer than 2 values has no test (NaN)."""
    n, mean, se, flat = _moments(np.atleast_2d(np.asarray(differences, dtype=float)))
    df = np.maximum(n - 1, 1)
    above = stats.t.sf((mean + margin) / se, df)  # H0: mean ≤ −margin
    below = stats.t.cdf((mean - margin) / se, df)  # H0: mean ≥ margin
    p = np.where(flat, np.where(np.abs(mean) < margin, 0.0, 1.0), np.maximum(above, below))
    return np.where(n >= 2, p, np.nan)


def tost_p(differences: Sequence[float], margin: float | None) -> float | None:
    """p of the paired two one-sided t-tests that the mean difference lies inside
    ``(−margin, margin)``: the larger of the one-sided t-tests against ``mean ≤ −margin``
    and ``mean ≥ margin`` (None below 2 pairs or without a margin). Differences that do not
    vary take the limit: 0 inside the margin, 1 on or outside it."""
    if len(differences) < 2 or margin is None or margin <= 0:
        return None
    return float(tost_ps(np.array([differences], dtype=float).reshape(1, -1), margin)[0])


def tost_interval(differences: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """The ``1 − 2·alpha`` t interval (90% at the default) of the mean difference that the
    TOST inverts: `tost_p` is below ``alpha`` exactly when it lies inside the margin.
    A point where the differences do not vary; None below 2 pairs."""
    if len(differences) < 2:
        return None
    n, mean, se, flat = _moments(np.array([differences], dtype=float).reshape(1, -1))
    half = 0.0 if flat[0] else float(stats.t.ppf(1 - alpha, n[0] - 1) * se[0])
    return float(mean[0]) - half, float(mean[0]) + half


def rounded(differences: np.ndarray | Sequence[float], scale: float) -> np.ndarray:
    """The differences to the rounding unit (`ROUNDING`) of values as large as ``scale``,
    so that differences equal up to rounding are equal."""
    d = np.asarray(differences, dtype=float)
    unit = ROUNDING * scale
    return np.round(d / unit) * unit if unit > 0 else np.where(np.isnan(d), d, 0.0)


def t_decides(differences: np.ndarray, scale: float) -> np.ndarray:
    """Per row of ``differences`` ``(R, n)`` (NaN: no pair), whether the paired t-test may
    decide: at least `T_MIN_PAIRS` pairs whose differences vary beyond rounding of values
    as large as ``scale``; elsewhere the exact sign-flip test decides."""
    n, _, _, flat = _moments(rounded(np.atleast_2d(differences), scale))
    return (n >= T_MIN_PAIRS) & ~flat


def sign_flip_ps(values: np.ndarray, side: int = 0) -> np.ndarray:
    """`sign_flip_p` per row of ``values`` ``(R, n)``, NaN entries taking no part; ``side``
    > 0 counts the patterns whose sum is at least the observed one, < 0 at most, 0 (two
    sided) at least as far from 0."""
    d = np.nan_to_num(np.atleast_2d(np.asarray(values, dtype=float)))
    observed, n = d.sum(axis=1)[:, None], d.shape[1]
    slack = 1e-9 * np.abs(d).sum(axis=1)[:, None]  # float sums of equal patterns tie
    hits = np.zeros(len(d))
    for start in range(0, 2**n, _PATTERNS):
        codes = np.arange(start, min(2**n, start + _PATTERNS))
        sums = d @ (1 - 2 * ((codes[:, None] >> np.arange(n)) & 1)).T  # (R, patterns)
        hit = (
            np.abs(sums) >= np.abs(observed) - slack
            if side == 0
            else sums >= observed - slack
            if side > 0
            else sums <= observed + slack
        )
        hits += hit.sum(axis=1)
    return hits / 2**n


def sign_flip_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact paired sign-flip (permutation) test that the differences
    are symmetric about 0: the share of the 2ⁿ sign patterns whose sum is at least as far
    from 0 as the observed one (None below 2 pairs). It needs no normal tails, and so has
    a floor: 2/2ⁿ, where every difference has one sign (`sign_flip_floor`)."""
    if len(differences) < 2:
        return None
    return float(sign_flip_ps(np.array([differences], dtype=float).reshape(1, -1))[0])


def sign_flip_floor(differences: Sequence[float]) -> float:
    """The smallest p `sign_flip_p` can give over these magnitudes (2/2ᵐ over m nonzero
    differences of distinct sums): a test whose floor is not below its level never
    rejects."""
    p = sign_flip_p([abs(d) for d in differences])
    return 1.0 if p is None else p


def sign_flip_tost_p(differences: Sequence[float], margin: float | None) -> float | None:
    """The exact TOST: the larger of the one-sided sign-flip p-values against
    ``mean ≤ −margin`` (of the differences plus the margin) and ``mean ≥ margin`` (minus
    it); None below 2 pairs or without a margin. Its floor is 1/2ⁿ."""
    if len(differences) < 2 or margin is None or margin <= 0:
        return None
    d = np.array([differences], dtype=float).reshape(1, -1)
    return float(max(sign_flip_ps(d + margin, side=1)[0], sign_flip_ps(d - margin, side=-1)[0]))


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


@lru_cache(maxsize=4096)
def _rank_sum_counts(doubled: tuple[int, ...]) -> np.ndarray:
    """How many of the 2ᵐ sign patterns of these doubled ranks (ties give halves) give
    each doubled rank sum of the positives, counted exactly."""
    counts = np.zeros(sum(doubled) + 1)
    counts[0] = 1.0
    for rank in doubled:
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    counts.setflags(write=False)
    return counts


def signed_rank_ps(values: np.ndarray) -> np.ndarray:
    """`signed_rank_p` per row of ``values`` ``(R, n)``, NaN where a row is all 0."""
    out = np.full(len(ranks := signed_ranks(values)), np.nan)
    for i, row in enumerate(ranks):
        if not (nonzero := row[row != 0]).size:
            continue
        doubled = np.rint(2 * np.abs(nonzero)).astype(int)
        counts = _rank_sum_counts(tuple(sorted(doubled.tolist())))
        total = int(doubled.sum())
        observed = abs(2 * int(doubled[nonzero > 0].sum()) - total)
        extreme = np.abs(2 * np.arange(total + 1) - total) >= observed
        out[i] = min(1.0, counts[extreme].sum() / 2.0 ** len(nonzero))
    return out


def signed_rank_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact signed-rank test (None if every difference is 0): the sum
    of the signed ranks of ``|d|`` (ties averaged, zeros dropped) against its distribution
    over every sign flip, counted exactly, ties and zeros included. Rank-based by
    necessity: it decides where a seed failed, a value with an order (its side's worst
    outcome) but no size a mean could use."""
    p = signed_rank_ps(np.array([differences], dtype=float).reshape(1, -1))[0]
    return None if math.isnan(p) else float(p)


def signed_rank_floor(values: Sequence[float]) -> float:
    """The smallest p `signed_rank_p` can give over these magnitudes: where every
    value has the same sign. A test whose floor is not below the level can never reject."""
    p = signed_rank_p([abs(v) for v in values])
    return 1.0 if p is None else p


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: no test, left out and
    left None), in their order: the smallest is multiplied by the family's size, the next by
    one less, and so on, each at least the one before and at most 1. A NaN is a bug
    upstream, never a p: it is refused."""
    if any(p is not None and not (isinstance(p, int | float) and 0 <= p <= 1) for p in pvalues):
        raise ValueError(f"holm needs p-values in [0, 1] or None, got {list(pvalues)}")
    drawn = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(drawn):
        running = max(running, min(1.0, (len(drawn) - rank) * p))
        adjusted[i] = running
    return adjusted


def holm_at(p: np.ndarray, others: Sequence[float]) -> np.ndarray:
    """The Holm-adjusted p of one test at each of the raw p-values ``p``, in a family whose
    other tests' raw p-values are ``others``: as `holm` would adjust it, the multiplier
    that of the rank it takes among them (a resample's p, never scaled by the factor Holm
    gave the observed p, which is 1/p where Holm capped it at 1)."""
    q = np.sort(np.asarray(others, dtype=float))
    size = len(q) + 1
    before = np.concatenate([[0.0], np.maximum.accumulate((size - np.arange(len(q))) * q)])
    rank = np.searchsorted(q, p, side="right")  # ties: the same adjusted p either way
    return np.minimum(1.0, np.maximum(before[rank], (size - rank) * np.asarray(p, float)))


def tarone(floors: Sequence[float], alpha: float = ALPHA) -> float:
    """The level a test's floor (the smallest p it can give) must lie below to count in a
    family (Tarone 1990): ``alpha / K`` for the smallest K such that at most K floors lie
    below it. A test that could never reach its Holm level does not enlarge the family
    that the others are adjusted over; one that can, does."""
    for k in range(1, len(floors) + 1):
        if sum(f < alpha / k for f in floors) <= k:
            return alpha / k
    return alpha


def detectable_difference(sd: float, n: int, alpha: float, power: float = POWER) -> float | None:
    """The smallest mean difference a two-sided paired t-test at level ``alpha`` detects
    with probability ``power`` over ``n`` pairs whose differences have deviation ``sd``:
    what a test that found nothing could have found. Solved exactly on the noncentral t
    distribution; None below 2 pairs or where the differences do not vary."""
    if n < 2 or not sd > 0:
        return None
    df, critical = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(shift: float) -> float:
        below = np.nan_to_num(stats.nct.cdf(-critical, df, shift))  # ≈ 0 once shift is large
        return float(stats.nct.sf(critical, df, shift) + below - power)

    shift = optimize.brentq(shortfall, 0.0, 2 * (critical + 3))
    return float(shift * sd / math.sqrt(n))


def _pairs(
    model: Mapping[int, float | None], control: Mapping[int, float | None] | float
) -> tuple[
    tuple[tuple[int, float | None, float | None], ...], tuple[tuple[int, ...], tuple[int, ...]]
]:
    """``(seed, model, control)`` over the seeds both ran, a value that is not finite as
    None; and the seeds only the model ran, and only the control (a fixed control: none)."""
    if isinstance(control, Mapping):
        both = sorted(set(model) & set(control))
        sides: dict[int, tuple[float | None, float | None]] = {
            s: (model[s], control[s]) for s in both
        }
        only: tuple[tuple[int, ...], tuple[int, ...]] = (
            tuple(sorted(set(model) - set(control))),
            tuple(sorted(set(control) - set(model))),
        )
    else:
        sides = {s: (v, float(control)) for s, v in sorted(model.items())}
        only = ((), ())
    pairs = tuple((s, _kept(m), _kept(c)) for s, (m, c) in sides.items())
    return pairs, only


def _kept(value: float | None) -> float | None:
    """``value`` as a float where it is finite, else None (a seed that did not finish)."""
    return float(value) if finite(value) else None


@dataclass(frozen=True)
class Paired:
    """``model − control`` seed by seed, failures included.

    The control is another model's per-seed values or a constant (an analytic bound). A seed
    either side did not finish (value None, or a non-finite metric) is never dropped: where
    one side failed, the pair counts as that side's worst outcome, ranked beyond every
    finished difference (``failed``: the seeds the model failed, ``control_failed``: the
    control's; a seed both failed is a tie). ``test`` names the deciding test
    (`decisive`): the paired t-test on the finished differences, the exact sign-flip test
    on them below `T_MIN_PAIRS` pairs or where they do not vary beyond rounding, or, with a
    one-sided failure, the exact signed-rank test, a failure having an order but no value.
    ``mean``, ``ci`` and ``sd`` describe the finished pairs only; ``tost`` is the
    equivalence p at ``margin`` by the same rule (paired-t, or exact sign-flip) and
    ``interval`` the 90% t interval of the mean difference (both None with a one-sided
    failure: a row that fails is not equivalent to one that does not). Seeds only one side
    ran are not compared, and listed (``only_model``, ``only_control``).
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
    #: The smallest p the deciding test could give over these seeds: 0 for the t-test,
    #: `sign_flip_floor` or `signed_rank_floor` for the exact tests.
    floor: float = 1.0
    only_model: tuple[int, ...] = ()
    only_control: tuple[int, ...] = ()
    #: Every seed both sides ran: ``(seed, model value, control value)``, None for a failure.
    pairs: tuple[tuple[int, float | None, float | None], ...] = ()
    #: The smallest p the equivalence test could give: 0 for the paired-t TOST, 1/2ⁿ for
    #: the exact one.
    tost_floor: float = 1.0

    @classmethod
    def of(
        cls,
        model: Mapping[int, float | None],
        control: Mapping[int, float | None] | float,
        higher_is_better: bool,
        margin: float | None = None,
    ) -> Paired:
        """Pair per-seed values (seed → value, None for a seed that did not finish) with
        the control's, over the seeds both ran."""
        pairs, only = _pairs(model, control)
        deciding, test, diffs = decisive(pairs, higher_is_better)
        finished = tuple(s for s, m, c in pairs if m is not None and c is not None)
        failed = tuple(s for s, m, c in pairs if m is None and c is not None)
        control_failed = tuple(s for s, m, c in pairs if c is None and m is not None)
        both_failed = tuple(s for s, m, c in pairs if m is None and c is None)
        mean, ci = mean_ci(diffs) if diffs else (None, None)
        sd = statistics.stdev(diffs) if len(diffs) > 1 else None
        one_sided = test == SIGNED_RANK
        p, floor = {
            PAIRED_T: (paired_t_p, lambda _: 0.0),
            SIGN_FLIP: (sign_flip_p, sign_flip_floor),
            SIGNED_RANK: (signed_rank_p, signed_rank_floor),
        }[test]
        tost, tost_floor, interval = None, 1.0, None
        if not one_sided and margin is not None:
            exact = test == SIGN_FLIP
            tost = (sign_flip_tost_p if exact else tost_p)(deciding, margin)
            tost_floor = 2.0 ** -len(deciding) if exact else 0.0
            interval = tost_interval(diffs)
        return cls(
            finished,
            tuple(diffs),
            mean,
            ci,
            sd,
            p(deciding),
            test,
            failed,
            control_failed,
            both_failed,
            margin,
            tost,
            float(np.sign(sum(deciding))),
            interval,
            floor(deciding),
            *only,
            pairs,
            tost_floor,
        )

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


#: The deciding tests, as `Paired.test` names them.
PAIRED_T, SIGN_FLIP = "paired t", "sign flip, exact"
SIGNED_RANK = "signed rank, failures last"


def failure_value(differences: Sequence[float], higher_is_better: bool) -> float:
    """The difference a seed the model failed counts as: beyond every finished difference,
    on the bad side for the model (the control's failure counts as its negative)."""
    worst = 1 + 2 * max((abs(d) for d in differences), default=1.0)
    return -worst if higher_is_better else worst


def value_scale(pairs: Sequence[tuple[int, float | None, float | None]]) -> float:
    """The largest finished value of ``(seed, model, control)`` pairs, either side: the
    size whose rounding (`ROUNDING`) the differences carry."""
    return max((abs(v) for _, m, c in pairs for v in (m, c) if v is not None), default=0.0)


def decisive(
    pairs: Sequence[tuple[int, float | None, float | None]], higher_is_better: bool
) -> tuple[list[float], str, list[float]]:
    """The values the deciding test reads, its name and the finished differences, from
    ``(seed, model, control)`` pairs: the differences for the t-test (`t_decides`), the
    differences to their rounding unit for the exact sign-flip test, or with a one-sided
    failure their signed ranks, each failure beyond every finished difference against its
    side."""
    diffs = [m - c for _, m, c in pairs if m is not None and c is not None]
    failed = sum(m is None and c is not None for _, m, c in pairs)
    control_failed = sum(c is None and m is not None for _, m, c in pairs)
    if not (failed or control_failed):
        scale = value_scale(pairs)
        if t_decides(np.array([diffs], dtype=float).reshape(1, -1), scale)[0]:
            return diffs, PAIRED_T, diffs
        return [float(d) for d in rounded(diffs, scale)], SIGN_FLIP, diffs
    against = failure_value(diffs, higher_is_better)
    ranked = [*diffs, *(against for _ in range(failed)), *(-against for _ in range(control_failed))]
    return list(signed_ranks(np.array([ranked]))[0]), SIGNED_RANK, diffs
