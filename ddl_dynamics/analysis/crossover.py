"""The crossover: how a model's advantage moves with a task's knob, and from where on it wins.

A task family may name a ``knob``, the spec field that moves it from one regime to another
(``switched``'s event rate ``p``, from a smooth flow to erase/rewrite events). An experiment
that sweeps it gives one task label per knob value and *setting* (the other spec values,
e.g. ``event=reflect``). For each setting, each model is followed across the knob against
its control: its baseline (the report's comparison) and, for ``ddl``, its write-only
control ``ddl-write`` (:data:`CONTRASTS`). At every knob value the comparison is the report's
paired test-metric difference over seeds (:class:`~.stats.Paired`), and the crossover ``p*``
is the smallest knob value from which on the model wins at every larger value in the run (a
paired t-test p < 0.05 on at least 3 seeds: the 95% CI stays on the model's better side);
None when it does not win at the largest value.

:func:`gate_use` asks whether the trained Delta stacks' gates follow the events: per knob
value, the share of gates in each event's regime (projection for an overwrite, reflection
for a reflection) at the steps where that event happens, against the share in that regime at
the steps without an event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._task import Subject, make_task
from ..experiment.store import RunResult
from ..models.operator import REGIMES, regime_index
from .expectations import budget_gap, match, seed_values
from .probes import erases, load_probes
from .stats import Estimate, Paired

#: Contrasts followed across the knob besides each model against its baseline: the Delta
#: stack against its write-only control, which isolates the erase term (for the
#: Transformer block at d_v = 1 and at d_v = 4).
CONTRASTS = (
    (Subject("ddl"), Subject("ddl-write")),
    (Subject("ddl-transformer"), Subject("ddl-write-transformer")),
    (Subject("ddl-transformer", {"value_channels": 4}),
     Subject("ddl-write-transformer", {"value_channels": 4})),
)


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
    """One model against one control across a knob: the paired difference at each value."""

    setting: Setting
    model: str
    control: str
    metric: str
    higher_is_better: bool
    #: ``(knob value, model − control over paired seeds)``, by increasing knob value.
    points: tuple[tuple[float, Paired], ...]
    #: ``p*`` (:func:`crossover_point`).
    star: float | None


def crossover_point(points: Sequence[tuple[float, Paired]], higher_is_better: bool
                    ) -> float | None:
    """``p*``: the smallest knob value from which on the model wins at every larger one
    (None: it does not win at the largest). ``points`` go by increasing knob value."""
    star = None
    for value, paired in reversed(points):
        if paired.outcome(higher_is_better) != "better":
            break
        star = value
    return star


@dataclass(frozen=True)
class GateUse:
    """How one Delta stack's gates follow one kind of event, across a knob.

    ``at_events``: per knob value, the share of gates in ``regime`` at the steps whose exact
    update is in that regime; ``elsewhere``: the share in ``regime`` at the steps without an
    event. Both are over seeds (mean, 95% CI of the per-seed shares).
    """

    setting: Setting
    model: str
    regime: str
    at_events: tuple[tuple[float, Estimate], ...]
    elsewhere: tuple[tuple[float, Estimate], ...]


def star_text(star: float | None, knob: str) -> str:
    """``p* = 0.25``, or ``none in range``."""
    return "none in range" if star is None else f"{knob}* = {star:g}"


def curve(points: Sequence[tuple[float, Paired | Estimate]]) -> tuple[list[float], ...]:
    """Knob values, means and CI half-widths (0 where there is none) of a curve's points."""
    kept = [(v, e) for v, e in points if e.mean is not None]
    return ([v for v, _ in kept], [e.mean for _, e in kept], [e.ci or 0.0 for _, e in kept])


def _settings(rows: Sequence[RunResult]) -> dict[str, tuple[Setting, float]]:
    """Task label → its setting and knob value, for the labels of knob families that the run
    has at two or more knob values in the same setting."""
    found: dict[str, tuple[str, str, tuple[tuple[str, Any], ...], float]] = {}
    for row in rows:
        config = row.config
        if row.task in found or "task" not in config:
            continue
        spec = config.get("spec", {})
        knob = make_task(config["task"], **spec).knob
        if knob is not None:
            others = tuple(sorted((k, v) for k, v in spec.items() if k != knob))
            found[row.task] = (config["task"], knob, others, float(spec[knob]))
    settings = {}
    for label, (family, knob, others, value) in found.items():
        peers = [(o, v) for f, _, o, v in found.values() if f == family]
        if len({v for o, v in peers if o == others}) < 2:
            continue
        shown = [f"{k}={v}" for k, v in others if any(dict(o)[k] != v for o, _ in peers)]
        settings[label] = (Setting(family, knob, ",".join(shown)), value)
    return settings


def crossovers(rows: Sequence[RunResult],
               comparisons: Iterable[tuple[str, str, str, Paired]]) -> list[Crossover]:
    """Every model's crossover against its controls, from a run's latest rows and its
    comparisons ``(task label, model, baseline, paired difference)``."""
    settings = _settings(rows)
    by_task: dict[str, list[RunResult]] = defaultdict(list)
    described: dict[Setting, dict[str, Any]] = {}  # how the metric reads, from any row
    for row in rows:
        if row.task in settings:
            by_task[row.task].append(row)
            if "metric" in row.metrics:
                described.setdefault(settings[row.task][0], row.metrics)
    pairs = {(t, m, c): p for t, m, c, p in comparisons if t in settings}
    for task, task_rows in by_task.items():
        for model, control in CONTRASTS:
            found = match(model, task_rows), match(control, task_rows)
            if all(len(labels) == 1 for labels in found):
                sides = [[r for r in task_rows if r.model == labels[0]] for labels in found]
                if not budget_gap(*sides):
                    pairs.setdefault((task, found[0][0], found[1][0]),
                                     Paired.of(*map(seed_values, sides)))
    curves: dict[tuple[Setting, str, str], list[tuple[float, Paired]]] = defaultdict(list)
    for (task, model, control), paired in pairs.items():
        setting, value = settings[task]
        curves[setting, model, control].append((value, paired))
    out = []
    for (setting, model, control), points in curves.items():
        metrics = described.get(setting, {})
        higher = bool(metrics.get("higher_is_better", False))
        ordered = tuple(sorted(points, key=lambda point: point[0]))
        out.append(Crossover(setting, model, control, metrics.get("metric", "metric"), higher,
                             ordered, crossover_point(ordered, higher)))
    return sorted(out, key=lambda c: (c.setting.family, c.setting.label, c.model, c.control))


def gate_use(run_dir: Path) -> list[GateUse]:
    """For every probed Delta stack on a swept knob family whose task marks its events
    (``step_regimes``), the share of gates in each event's regime at those events and
    elsewhere, per knob value (needs the run's probes)."""
    probed = [(row, arrays) for row, arrays in load_probes(run_dir)
              if erases(row) and "test_step_regimes" in arrays]
    settings = _settings([row for row, _ in probed])
    probed = [(row, arrays) for row, arrays in probed if row.task in settings]
    regimes: dict[Setting, set[int]] = defaultdict(set)  # the events' regimes, at any value
    for row, arrays in probed:
        events = arrays["test_step_regimes"]
        regimes[settings[row.task][0]].update(int(i) for i in np.unique(events[events >= 0]))
    shares: dict[tuple[Setting, str, int], dict[str, dict[float, list[float]]]] = defaultdict(
        lambda: {"at_events": defaultdict(list), "elsewhere": defaultdict(list)})
    for row, arrays in probed:
        setting, value = settings[row.task]
        used = regime_index(torch.as_tensor(arrays["beta"])).numpy()  # (N, L)
        events = arrays["test_step_regimes"]  # (N, L): the exact step's regime, −1 for none
        for index in regimes[setting]:
            found = shares[setting, row.model, index]
            for where, steps in (("at_events", events == index), ("elsewhere", events < 0)):
                if steps.any():
                    found[where][value].append(float((used[steps] == index).mean()))
    return [GateUse(setting, model, REGIMES[index],
                    *(tuple((v, Estimate.of(found[where][v])) for v in sorted(found[where]))
                      for where in ("at_events", "elsewhere")))
            for (setting, model, index), found in sorted(
                shares.items(), key=lambda kv: (kv[0][0].family, kv[0][0].label, *kv[0][1:]))]
