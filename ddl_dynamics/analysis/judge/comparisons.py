"""Comparisons: the tests a report draws, judged together.

Whatever asks for a comparison (each row's baseline, the experiment's ``[[comparisons]]``, a
task's expectation) hands a `Request`; `judge` turns the requests of one run
into `Comparison`s by the rule book (`verdicts`): the gates first, then the
paired test per request, then Holm's adjustment over every test the report draws (one
test per distinct task, unordered pair of rows and split, however many asked for it, and
only tests whose floor can reach their Holm level: `tarone`), then the labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, cast

from ..._task import IGNORE_INDEX, Task, make_task
from ...experiment.grid import grid_value, point_text
from ..run import Row, Run
from .labels import EQUAL, INCONCLUSIVE, entry
from .stats import ALPHA, PAIRED_T, Paired, detectable_difference, holm, tarone
from .verdicts import (
    MIN_PAIRS,
    at_floor,
    both_solved,
    flagged,
    gates,
    label,
    larger,
    non_finite,
    seed_values,
    strictest,
    unsolved,
)

Key = tuple[str, str, str | float, str]


@dataclass(frozen=True)
class Request:
    """One comparison asked for: row ``model`` against row ``control`` (a label) or an
    analytic bound (a number), on ``split`` of ``task``; ``requires`` (for a split other
    than test) is the test metric both rows must reach first, in the metric's direction
    (accuracy ≥ requires, MSE ≤ requires). ``kind`` says who asked: ``"baseline"``,
    ``"declared"`` or ``"expectation"``; ``control_larger``: the control is larger on
    purpose (`verdicts.gates`)."""

    task: str
    model: str
    control: str | float
    kind: str
    split: str = "test"
    requires: float | None = None
    control_larger: bool = False

    @property
    def key(self) -> Key:
        return self.task, self.model, self.control, self.split


@dataclass(frozen=True)
class Comparison:
    """One judged comparison: model − control on a split's metric, paired over seeds.

    ``paired`` is None where no test could be drawn (a gate closed, or a row missing);
    ``label`` is one of `labels.LABELS`; ``p_adjusted`` and ``tost_adjusted`` are
    Holm-adjusted within the report (None for a test outside the family: a ceiling or a
    floor, too few pairs, or an exact test whose floor cannot reach its Holm level: the
    note says so); which test decided is ``paired.test``; ``detectable`` is the
    smallest difference the paired t-test could have found over its n pairs (80% power, at
    the Bonferroni level of the report's family; None where failures decide: the signed
    ranks have no scale to state one in).
    ``grid`` gives, for a tuned pair, whether the model does better at each grid value
    (True, False, or None for neither). ``note`` says what limits the verdict: a gate, an
    out-of-distribution comparison moved to the trained split, failed, non-finite, unpaired
    or ⚑ seeds.
    """

    task: str
    model: str
    control: str | float
    split: str
    kinds: tuple[str, ...]
    metric: str
    higher_is_better: bool
    label: str
    paired: Paired | None = None
    p_adjusted: float | None = None
    tost_adjusted: float | None = None
    detectable: float | None = None
    chosen: str = ""
    control_chosen: str = ""
    grid: tuple[tuple[str, bool | None], ...] = ()
    note: str = ""
    #: The split asked for, where the comparison had to move to the trained one.
    asked_split: str = ""
    #: Both rows at the metric's best value on every seed (a ceiling, no test).
    solved: bool = False
    #: Both rows at or below the task's floor on every seed (no test).
    floored: bool = False
    #: Equivalent, and yet the difference test is significant too (named in the note).
    also_different: bool = False
    #: Where the task's absolute margin binds and exceeds both means, the margin in units
    #: of the larger mean's size: "absolute floor ±x = k× the means".
    margin_ratio: float | None = None

    @property
    def control_text(self) -> str:
        return self.control if isinstance(self.control, str) else f"{self.control:.4g}"

    def significant(self, p_adjusted: float | None = None) -> bool | None:
        """Whether a significant difference (adjusted p below the level) favours the model;
        None where there is none. ``p_adjusted`` defaults to the comparison's own."""
        p = self.p_adjusted if p_adjusted is None else p_adjusted
        if self.paired is None or p is None or p >= ALPHA:
            return None
        return self.paired.better(self.higher_is_better)

    @property
    def grid_holds(self) -> bool | None:
        """Whether the verdict's direction holds at every grid value (None: untuned, or no
        direction to hold)."""
        signs = [s for _, s in self.grid]
        if not signs or self.paired is None:
            return None
        overall = self.paired.better(self.higher_is_better)
        return None if overall is None else all(s == overall for s in signs)


def merge(run: Run, requests: Sequence[Request]) -> dict[Key, tuple[Request, tuple[str, ...]]]:
    """One request per key, with every kind that asked for it and the strictest
    ``requires`` any of them states (in the task's direction), a mirrored request's
    included: a vs b and b vs a are one test, judged on one split."""
    found: dict[Key, list[Request]] = {}
    for request in requests:
        found.setdefault(request.key, []).append(request)
    thresholds: dict[tuple[Any, ...], list[float]] = {}
    for request in requests:
        if request.requires is not None:
            thresholds.setdefault(_unordered(request), []).append(request.requires)
    merged = {}
    for key, asked in found.items():
        rows = run.task_rows(asked[0].task)
        higher = next(iter(rows.values())).higher_is_better if rows else True
        stated = thresholds.get(_unordered(asked[0]))
        request = replace(
            asked[0],
            requires=strictest(stated, higher) if stated else None,
            control_larger=any(r.control_larger for r in asked),
        )
        merged[key] = request, tuple(dict.fromkeys(r.kind for r in asked))
    return merged


def _drawn(c: Comparison) -> bool:
    """Whether a test is drawn: enough pairs, and neither a ceiling nor a floor."""
    return c.paired is not None and c.paired.n >= MIN_PAIRS and not c.solved and not c.floored


def _family(
    tests: Sequence[Comparison], floor: Callable[[Paired], float]
) -> tuple[list[Comparison], float]:
    """The tests that count in a family (Tarone: those whose floor can reach their Holm
    level, `tarone`) and that level."""
    floors = [floor(cast(Paired, c.paired)) for c in tests]
    level = tarone(floors)
    return [c for c, f in zip(tests, floors, strict=True) if f < level], level


def judge(run: Run, requests: Sequence[Request]) -> dict[Key, Comparison]:
    """Every request judged (one per key, its kinds merged), Holm-adjusted together."""
    merged = merge(run, requests)
    drafts = {key: _draw(run, request, kinds) for key, (request, kinds) in merged.items()}
    # one test per task, unordered pair and split: a mirrored request, or one moved to the
    # trained split onto a pair drawn there, is the same test
    tested: dict[tuple[Any, ...], Comparison] = {}
    for c in drafts.values():
        if c.paired is not None:
            tested.setdefault(_unordered(c), c)
    adjusted, tost_adjusted, size, level = _holm_by_test([c for c in tested.values() if _drawn(c)])
    alpha = ALPHA / max(1, size)
    out = {}
    for key, c in drafts.items():
        if c.paired is None:
            out[key] = c
            continue
        p, t = adjusted.get(_unordered(c)), tost_adjusted.get(_unordered(c))
        detectable = (
            detectable_difference(c.paired.sd, c.paired.n, alpha)
            if c.paired.test == PAIRED_T and c.paired.sd is not None
            else None
        )
        judged = label(c.paired, p, t, c.higher_is_better, c.solved, c.floored)
        notes = [c.note] if c.note else []
        ahead = c.significant(p) if entry(judged).shows == EQUAL else None
        if ahead is not None:
            notes.append(
                f"{c.model} significantly {'better' if ahead else 'worse'}, by less "
                f"than the margin ±{c.paired.margin:.2g}"
            )
        if p is None and _drawn(c) and c.paired.floor >= level:
            notes.append(
                f"outside the family: the exact test's p cannot fall below "
                f"{c.paired.floor:.2g} at n = {c.paired.n}, nor so reach its Holm "
                f"level {level:.2g}"
            )
        out[key] = replace(
            c,
            p_adjusted=p,
            tost_adjusted=t,
            label=judged,
            detectable=detectable,
            note="; ".join(notes),
            also_different=ahead is not None,
        )
    return out


def _holm_by_test(
    drawn: list[Comparison],
) -> tuple[dict[tuple[Any, ...], float | None], dict[tuple[Any, ...], float | None], int, float]:
    """Holm-adjusted p of each drawn test's difference and of its TOST, by test, over the
    families whose floors can reach their levels (Tarone); the difference family's size and
    level."""
    family, level = _family(drawn, lambda p: p.floor)
    tost_family, _ = _family(
        [c for c in drawn if cast(Paired, c.paired).tost is not None], lambda p: p.tost_floor
    )
    # (both families hold paired comparisons only)
    adjusted = dict(
        zip(map(_unordered, family), holm([cast(Paired, c.paired).p for c in family]), strict=True)
    )
    tost_adjusted = dict(
        zip(
            map(_unordered, tost_family),
            holm([cast(Paired, c.paired).tost for c in tost_family]),
            strict=True,
        )
    )
    return adjusted, tost_adjusted, len(family), level


def _unordered(c: Comparison | Request) -> tuple[Any, ...]:
    """A test's identity whichever row is the control."""
    pair = frozenset((c.model, c.control)) if isinstance(c.control, str) else (c.model, c.control)
    return c.task, pair, c.split


def _draw(run: Run, request: Request, kinds: tuple[str, ...]) -> Comparison:
    """A request's comparison before the report-wide adjustment: its gates and its test."""
    rows = run.task_rows(request.task)
    model = rows.get(request.model)
    control = rows.get(request.control) if isinstance(request.control, str) else None
    some = model or control or next(iter(rows.values()))
    higher, metric = some.higher_is_better, some.described.get("metric", "metric")
    base = Comparison(*request.key[:3], request.split, kinds, metric, higher, INCONCLUSIVE)
    missing = [
        label
        for label, row in ((request.model, model), (request.control, control))
        if isinstance(label, str) and row is None
    ]
    if missing:
        return replace(base, note=f"{', '.join(missing)} not in this run")
    assert model is not None
    sides = [model.selected] + ([control.selected] if control else [])
    chosen: dict[str, Any] = {
        "chosen": model.chosen_text(),
        "control_chosen": control.chosen_text() if control else "",
    }
    if control is not None:
        for closed, gap in gates(request.control_larger):
            if why := gap(*sides):
                return replace(base, label=closed, note=why, **chosen)
    split, notes = _judged_split(request, sides, higher, metric)
    if request.control_larger and control is not None:
        notes.insert(0, larger(*sides))
    ours = seed_values(model.selected, split)
    theirs = seed_values(control.selected, split) if control else float(request.control)
    config = model.selected[0].config
    task = make_task(config["task"], **config.get("spec", {})) if "task" in config else None
    margin, ratio = _margin(task, model, control, split)
    paired = Paired.of(ours, theirs, higher, margin)
    notes += _failure_notes(model, control, paired, split)
    grid = (
        _grid_signs(model, control, request.control, split, higher)
        if model.grid or (control and control.grid)
        else ()
    )
    return replace(
        base,
        split=split,
        paired=paired,
        grid=grid,
        note="; ".join(notes),
        asked_split=request.split if split != request.split else "",
        solved=paired.total == paired.n and both_solved(ours, theirs, metric),
        floored=_floored(task, config, ours, theirs, higher),
        margin_ratio=ratio,
        **chosen,
    )


def _floored(
    task: Task | None, config: dict[str, Any], ours: Any, theirs: Any, higher: bool
) -> bool:
    """Whether both rows sit at the task's chance or shortcut floor on every seed."""
    if task is None or task.floor is None or not isinstance(theirs, dict):
        return False
    return at_floor(ours, theirs, task.floor, floor_band(task, config), higher)


def _judged_split(
    request: Request, sides: list[Any], higher: bool, metric: str
) -> tuple[str, list[str]]:
    """The split a comparison is judged on, and why if not the one asked: a split past
    training is judged only where both rows learned the trained one (``requires``)."""
    if request.split == "test" or request.requires is None:
        return request.split, []
    why = [w for rows in sides if (w := unsolved(rows, request.requires, higher, metric))]
    if not why:
        return request.split, []
    return "test", [
        f"{request.split} not judged: "
        + "; ".join(why)
        + ", so the comparison stays on the trained split"
    ]


def _paired(
    model: Row,
    control: Row | None,
    bound: str | float,
    split: str,
    higher: bool,
    at: tuple[Any, ...],
    control_at: tuple[Any, ...],
) -> Paired:
    ours = seed_values(model.at(at), split)
    theirs = seed_values(control.at(control_at), split) if control else float(bound)
    return Paired.of(ours, theirs, higher)


def _grid_signs(
    model: Row, control: Row | None, bound: str | float, split: str, higher: bool
) -> tuple[tuple[str, bool | None], ...]:
    """Whether the model does better at each grid value: the model and the control each at
    that value where they are tuned over it, else at their chosen value."""
    tuned = model if model.grid else control
    assert tuned is not None
    values = sorted({grid_value(c.config, list(tuned.grid)) for c in tuned.cells})
    signs = []
    for value in values:
        at = value if model.grid == tuned.grid else model.chosen
        control_at = (
            value if control and control.grid == tuned.grid else control.chosen if control else ()
        )
        paired = _paired(model, control, bound, split, higher, at, control_at)
        signs.append((point_text(list(tuned.grid), value), paired.better(higher)))
    return tuple(signs)


def _margin(
    task: Task | None, model: Row, control: Row | None, split: str
) -> tuple[float | None, float | None]:
    """The equivalence margin the task states, on the compared split, at the smaller of the
    two rows' means there (the same whichever row is the control; None against a bound: a
    model is compared with a bound to beat it, not to equal it); and where the task's
    absolute term binds above both means, the margin over the larger of their sizes."""
    if control is None or task is None:
        return None, None
    means = []
    for row in (model, control):
        values = [v for v in seed_values(row.selected, split).values() if v is not None]
        if not values:
            return None, None
        means.append(sum(values) / len(values))
    margin, size = min(task.equivalence_margin(m) for m in means), max(map(abs, means))
    above = margin == task.margin_terms[1] and 0 < size < margin
    return margin, margin / size if above else None


def _failure_notes(model: Row, control: Row | None, paired: Paired, split: str) -> list[str]:
    notes = []
    for row, failed in ((model, paired.failed), (control, paired.control_failed)):
        if row is not None and failed:
            notes.append(
                f"{row.label} fails {len(failed) + len(paired.both_failed)}/"
                f"{paired.total} (seeds {', '.join(map(str, failed))} rank last)"
            )
    if paired.both_failed:
        notes.append(f"both fail seed(s) {', '.join(map(str, paired.both_failed))}")
    for row in (model, control):
        if row is not None and (seeds := non_finite(row.selected, split)):
            notes.append(
                f"{row.label}: {split} not finite on seed(s) "
                f"{', '.join(map(str, seeds))}, counted as failures"
            )
    for row, only in ((model, paired.only_model), (control, paired.only_control)):
        if row is not None and only:
            notes.append(f"seed(s) {', '.join(map(str, only))} only in {row.label}, not compared")
    for row in (model, control):
        if row is not None and (seeds := flagged(row.selected)):
            notes.append(
                f"⚑ {row.label}: ODE reconstruction failed on seed(s) "
                f"{', '.join(map(str, seeds))} (values kept)"
            )
    return notes


#: How many binomial standard deviations above its floor an accuracy still reads at it: a
#: model that scores the floor lands within 3 of it on all of 16 seed scores (8 seeds, two
#: rows) with probability about 0.98.
FLOOR_SDS = 3.0


def floor_band(task: Task, config: Mapping[str, Any]) -> float:
    """How far past its floor a seed may score and still sit at it: the task's margin there,
    and for an accuracy at least `FLOOR_SDS` binomial standard deviations of a model that
    scores the floor on the cell's test split (``config``'s ``n_test`` samples, each with its
    scored answers): on 512 var-chain queries a seed at the 0.625 shortcut scores 0.625 ±
    0.021, more than the 0.01 margin."""
    margin = task.equivalence_margin(cast(float, task.floor))
    n_test = config.get("train", {}).get("n_test")
    if task.metric_name != "accuracy" or not isinstance(n_test, int):
        return margin
    answers = _scored_answers(
        config["task"], json.dumps(config.get("spec", {}), sort_keys=True), n_test
    )
    floor = cast(float, task.floor)
    return max(margin, FLOOR_SDS * (floor * (1 - floor) / answers) ** 0.5)


@lru_cache(maxsize=64)
def _scored_answers(name: str, spec: str, n_test: int) -> int:
    """The answers a test split of ``n_test`` samples scores: every target of a vector task,
    the scored tokens of a sequence task (``spec``: the task's spec as JSON, so that the
    count is cached per task)."""
    task = make_task(name, **json.loads(spec))
    targets = task.sample(n_test, 0, "test").targets
    return int((targets != IGNORE_INDEX).sum()) if task.kind == "sequence" else len(targets)
