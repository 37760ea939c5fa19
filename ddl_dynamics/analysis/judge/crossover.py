"""The crossover: how a model's advantage moves with a task's knob, and from where on it wins.

A task family may name a ``knob``, the spec field that moves it from one regime to another
(``switched``'s event rate ``p``, from a smooth flow to erase/rewrite events). An experiment
that sweeps it gives one task label per knob value and *setting* (the other spec values,
e.g. ``event=reflect``, and the model width, e.g. ``width=16``, where the run sweeps the
knob at several). For each setting, each of the report's comparisons (a row against
its baseline, or a declared comparison) is followed across the knob: at every knob value
its judged, Holm-adjusted label (`verdicts`), with n. The crossover ``p*`` is the
smallest knob value from which on the model wins at every larger value in the run; None
when it does not win at the largest. Because it reads adjusted verdicts, one point that
misses significance moves it; its bootstrap interval over seeds (`star_interval`),
failed seeds included, says how firmly p* itself stands.

Whether the gates follow the knob's events is read from the probes, in `events`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._task import make_task
from ...experiment.result import RunResult
from ..run import Run
from .comparisons import Comparison
from .labels import BETTER, entry
from .stats import (
    ALPHA,
    Estimate,
    Paired,
    failure_value,
    holm_at,
    paired_t_ps,
    rounded,
    sign_flip_ps,
    signed_rank_ps,
    signed_ranks,
    t_decides,
    tost_ps,
    value_scale,
)
from .verdicts import MIN_PAIRS

#: Resamples of the seeds behind `star_interval`.
BOOTSTRAP = 1000


@dataclass(frozen=True)
class Setting:
    """A swept task family at fixed other spec values: the x-axis of one crossover panel."""

    family: str
    knob: str
    #: The spec values (besides the knob) that tell this setting from the family's others,
    #: as ``"event=reflect"``; empty when the family has one setting.
    label: str


@dataclass(frozen=True)
class Crossover:
    """One model against one control across a knob: the judged comparison at each value."""

    setting: Setting
    model: str
    control: str
    metric: str
    higher_is_better: bool
    #: ``(knob value, the comparison there)``, by increasing knob value.
    points: tuple[tuple[float, Comparison], ...]
    #: ``p*`` (`crossover_point`).
    star: float | None
    #: The 95% bootstrap interval of ``p*`` over seeds (`star_interval`);
    #: ``math.inf`` stands for "none in range".
    interval: tuple[float, float] | None = None


def crossover_point(points: Sequence[tuple[float, Comparison]]) -> float | None:
    """``p*``: the smallest knob value from which on the model wins (a label that shows it
    better) at every larger one (None: it does not win at the largest). ``points`` go by
    increasing knob value."""
    star = None
    for value, comparison in reversed(points):
        if entry(comparison.label).shows != BETTER:
            break
        star = value
    return star


def star_interval(
    points: Sequence[tuple[float, Comparison]],
    higher_is_better: bool,
    family: Iterable[Comparison] = (),
    resamples: int = BOOTSTRAP,
) -> tuple[float, float] | None:
    """A 95% percentile bootstrap interval, over seeds, of ``p*`` itself
    (`crossover_point`; ``math.inf`` where a resample wins nowhere from some value on).
    The seeds are resampled jointly across the knob (the same seeds see every knob value),
    failed seeds among them as the failures they are; at each knob value the deciding test
    (`decisive`) and the TOST are redrawn on the resampled seeds, and each p Holm-adjusted
    over the report's family (``family``: every judged comparison of the report; the
    points alone by default) with the other tests' p-values as drawn, so a resample's label
    follows the report's rule (a seed drawn twice counting once towards the `MIN_PAIRS`
    pairs a label needs). A value without a test in the family never wins. None with
    fewer than 2 seeds."""
    seeds = sorted({s for _, c in points if c.paired for s, _, _ in c.paired.pairs})
    if len(seeds) < 2 or not points:
        return None
    tested = _families([*family] or [c for _, c in points])
    draws = np.random.default_rng(0).integers(0, len(seeds), (resamples, len(seeds)))
    stars = np.full(resamples, math.inf)
    alive = np.ones(resamples, dtype=bool)  # won at every larger knob value so far
    for value, c in reversed(points):  # from the largest down: a loss there settles p*
        others = [{k: v for k, v in found.items() if k != _identity(c)} for found in tested]
        alive[alive] = _wins(c, seeds, draws[alive], higher_is_better, *others)
        stars[alive] = value
        if not alive.any():
            break
    low, high = np.percentile(stars, [2.5, 97.5], method="inverted_cdf")
    return float(low), float(high)


#: A seed's outcome at one knob value, for `_wins`.
_FINISHED, _FAILED, _CONTROL_FAILED, _BOTH_FAILED, _NOT_RUN = range(5)


def _identity(c: Comparison) -> tuple[Any, ...]:
    """A test's identity whichever row is the control (a mirrored pair is one test)."""
    return c.task, frozenset((c.model, c.control_text)), c.split


def _families(judged: Iterable[Comparison]) -> tuple[dict[tuple[Any, ...], float], ...]:
    """The raw p-values of the report's two families, by test: the difference tests and
    the equivalence tests that Holm adjusted."""
    tests: dict[tuple[Any, ...], float] = {}
    tosts: dict[tuple[Any, ...], float] = {}
    for c in judged:
        if c.paired is not None and c.paired.p is not None and c.p_adjusted is not None:
            tests[_identity(c)] = c.paired.p
        if c.paired is not None and c.paired.tost is not None and c.tost_adjusted is not None:
            tosts[_identity(c)] = c.paired.tost
    return tests, tosts


def _seed_outcomes(
    p: Paired, seeds: Sequence[int], higher_is_better: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per seed, how its pair ended (finished, a side failed, both failed, not run) and the
    difference it counts with: a failed side is its worst outcome, as in the report."""
    found = {s: (m, ctl) for s, m, ctl in p.pairs}
    kind = np.full(len(seeds), _NOT_RUN)
    value = np.zeros(len(seeds))
    against = failure_value(p.differences, higher_is_better)
    for i, s in enumerate(seeds):
        if s not in found:
            continue
        m, ctl = found[s]
        kind[i], value[i] = (
            (_FINISHED, m - ctl)
            if m is not None and ctl is not None
            else (_FAILED, against)
            if m is None and ctl is not None
            else (_CONTROL_FAILED, -against)
            if ctl is None and m is not None
            else (_BOTH_FAILED, 0.0)
        )
    return kind, value


def _wins(
    c: Comparison,
    seeds: Sequence[int],
    draws: np.ndarray,
    higher_is_better: bool,
    others: Mapping[Any, float],
    tost_others: Mapping[Any, float],
) -> np.ndarray:
    """Whether the comparison wins on each resample of ``seeds`` (``draws``: indices), its
    p-values adjusted among the ``others`` of their families."""
    p = c.paired
    if p is None or p.p is None or c.p_adjusted is None or not len(draws):
        return np.zeros(len(draws), dtype=bool)
    kind, value = _seed_outcomes(p, seeds, higher_is_better)
    kinds, values = kind[draws], value[draws]
    one_sided = ((kinds == _FAILED) | (kinds == _CONTROL_FAILED)).any(axis=1)
    finished = np.where(kinds == _FINISHED, values, np.nan)
    # the t-test on the finished pairs where it decides, else the exact sign flips; the
    # signed ranks where a side failed (a seed both failed, or not run, is a zero there: it
    # drops out of the ranks and of the sum)
    scale = value_scale(p.pairs)
    t = ~one_sided & t_decides(finished, scale)
    flip = ~one_sided & ~t
    ps = np.full(len(draws), np.nan)
    ps[t] = paired_t_ps(finished[t])
    ps[flip] = sign_flip_ps(rounded(finished[flip], scale))
    ps[one_sided] = signed_rank_ps(values[one_sided])
    total = np.where(one_sided, signed_ranks(values).sum(axis=1), values.sum(axis=1))
    better = (total != 0) & ((total > 0) == higher_is_better)
    # a label needs MIN_PAIRS finished pairs: a seed drawn twice is one pair, not two
    seen = np.sort(np.where(kinds == _FINISHED, draws, -1), axis=1)
    distinct = ((seen[:, 1:] != seen[:, :-1]) & (seen[:, 1:] >= 0)).sum(axis=1) + (seen[:, 0] >= 0)
    enough = distinct >= MIN_PAIRS
    wins = enough & better & (holm_at(ps, list(others.values())) < ALPHA)
    if p.margin is not None and p.tost is not None and c.tost_adjusted is not None and (wins.any()):
        # equivalence comes first, as in the report: a resample inside the margin is no win
        tost = tost_ps(finished[wins], p.margin)
        exact = ~t[wins]  # the exact TOST where the exact test decides
        tost[exact] = np.maximum(
            sign_flip_ps(rounded(finished[wins][exact], scale) + p.margin, side=1),
            sign_flip_ps(rounded(finished[wins][exact], scale) - p.margin, side=-1),
        )
        inside = ~one_sided[wins] & (holm_at(tost, list(tost_others.values())) < ALPHA)
        wins[np.flatnonzero(wins)[inside]] = False
    return wins


def star_text(star: float | None, knob: str) -> str:
    """``p* = 0.25``, or ``none in range``."""
    return "none in range" if star is None else f"{knob}* = {star:g}"


def interval_text(interval: tuple[float, float] | None) -> str:
    """``[0.05, 0.25]``, with ``none`` for a bound beyond the range."""
    if interval is None:
        return "—"
    low, high = ("none" if math.isinf(v) else f"{v:g}" for v in interval)
    return f"[{low}, {high}]"


def curve(points: Sequence[tuple[float, Paired | Estimate]]) -> tuple[list[float], ...]:
    """Knob values, means and CI half-widths (0 where there is none) of a curve's points."""
    kept = [(v, e.mean, e.ci or 0.0) for v, e in points if e.mean is not None]
    return [v for v, _, _ in kept], [m for _, m, _ in kept], [c for _, _, c in kept]


def knob_settings(rows: Sequence[RunResult]) -> dict[str, tuple[Setting, float]]:
    """Task label → its setting and knob value, for the labels of knob families that the run
    has at two or more knob values in the same setting."""
    found: dict[str, tuple[str, str, tuple[tuple[str, Any], ...], float]] = {}
    for row in rows:
        config = row.config
        if row.task in found or "task" not in config:
            continue
        spec = config.get("spec", {})
        knob = make_task(config["task"], **spec).knob
        if knob is not None:  # the model width too: a sweep of hops at each of two widths
            others = (
                *sorted((k, v) for k, v in spec.items() if k != knob),
                ("width", config.get("config", {}).get("width")),
            )
            found[row.task] = (config["task"], knob, others, float(spec[knob]))
    values: dict[tuple[str, tuple[tuple[str, Any], ...]], set[float]] = defaultdict(set)
    for family, _, others, value in found.values():
        values[family, others].add(value)
    swept = [key for key, found_at in values.items() if len(found_at) >= 2]
    settings = {}
    for label, (family, knob, others, value) in found.items():
        if (family, others) not in swept:
            continue
        # named by what tells it from the family's other swept settings
        shown = [
            f"{k}={v}" for k, v in others if any(dict(o)[k] != v for f, o in swept if f == family)
        ]
        settings[label] = (Setting(family, knob, ",".join(shown)), value)
    return settings


def crossovers(
    run: Run, comparisons: Iterable[Comparison], family: Iterable[Comparison] = ()
) -> list[Crossover]:
    """Every comparison of the report on a swept knob's tasks, followed across the knob;
    ``family``: every comparison the report judged, whose tests its p-values were
    adjusted with (the comparisons alone by default)."""
    comparisons = list(comparisons)
    family = list(family) or comparisons
    settings = knob_settings(run.selected())
    curves: dict[tuple[Setting, str, str], list[tuple[float, Comparison]]] = defaultdict(list)
    for c in comparisons:
        if c.task in settings and isinstance(c.control, str) and c.split == "test":
            setting, value = settings[c.task]
            curves[setting, c.model, c.control].append((value, c))
    out = []
    for (setting, model, control), points in curves.items():
        ordered = tuple(sorted(points, key=lambda point: point[0]))
        first = ordered[0][1]
        out.append(
            Crossover(
                setting,
                model,
                control,
                first.metric,
                first.higher_is_better,
                ordered,
                crossover_point(ordered),
                star_interval(ordered, first.higher_is_better, family),
            )
        )
    return sorted(out, key=lambda c: (c.setting.family, c.setting.label, c.model, c.control))
