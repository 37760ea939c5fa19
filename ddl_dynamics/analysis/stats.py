"""Statistics over seeds: confidence intervals and paired tests, small and pure.

Every model of a task sees the same data and the same initial-weight stream for a given
seed, so two models are compared *paired*: on the per-seed differences over the seeds both
finished. The decision rule is the paired t-test at :data:`ALPHA` with at least
:data:`MIN_PAIRS` pairs; the Wilcoxon signed-rank test is reported beside it from
:data:`WILCOXON_MIN_PAIRS` pairs, a check that one outlying seed does not carry the result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scipy import stats

#: Significance level of every verdict.
ALPHA = 0.05
#: Fewest paired seeds a verdict rests on: below it, no result either way.
MIN_PAIRS = 3
#: Fewest pairs for the Wilcoxon signed-rank p: its exact two-sided p cannot fall below
#: 2 / 2ⁿ, which first drops under ALPHA at n = 6.
WILCOXON_MIN_PAIRS = 6

Outcome = Literal["better", "worse", "no difference", "too few seeds"]


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
    """Two-sided p of the paired t-test on per-seed differences (``scipy.stats.ttest_rel``):
    None below 2 pairs or when every difference is 0; 0 when they are equal and non-zero."""
    if len(differences) < 2:
        return None
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    if sd == 0:
        return None if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(len(differences)))
    return float(2 * stats.t.sf(abs(t), len(differences) - 1))


def wilcoxon_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the Wilcoxon signed-rank test (``scipy.stats.wilcoxon``, zero
    differences dropped), from :data:`WILCOXON_MIN_PAIRS` pairs; None below or if all are 0."""
    if len(differences) < WILCOXON_MIN_PAIRS or not any(differences):
        return None
    return float(stats.wilcoxon(differences).pvalue)


@dataclass(frozen=True)
class Paired:
    """``model − control`` per seed, over the seeds where both finished, and its tests.

    The control is another model's per-seed values or a constant (an analytic bound; then
    the t-test is the one-sample test against it). ``ci`` is the 95% t-interval half-width
    of the mean difference; it excludes 0 exactly when ``p < 0.05``.
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float | None
    ci: float | None
    p: float | None
    wilcoxon: float | None

    @classmethod
    def of(cls, model: Mapping[int, float], control: Mapping[int, float] | float) -> Paired:
        """Pair per-seed values (seed → finite value) with the control's."""
        if isinstance(control, Mapping):
            seeds = tuple(sorted(set(model) & set(control)))
            diffs = tuple(model[s] - control[s] for s in seeds)
        else:
            seeds = tuple(sorted(model))
            diffs = tuple(model[s] - control for s in seeds)
        mean, ci = mean_ci(diffs) if diffs else (None, None)
        return cls(seeds, diffs, mean, ci, paired_t_p(diffs), wilcoxon_p(diffs))

    @property
    def n(self) -> int:
        return len(self.seeds)

    def outcome(self, higher_is_better: bool) -> Outcome:
        """Whether the model is significantly better or worse than the control, neither,
        or whether there are too few pairs to say."""
        if self.n < MIN_PAIRS:
            return "too few seeds"
        if self.p is None or self.p >= ALPHA or self.mean is None:
            return "no difference"
        return "better" if (self.mean > 0) == higher_is_better else "worse"
