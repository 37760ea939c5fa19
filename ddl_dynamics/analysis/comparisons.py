"""Comparisons: the tests a report draws, judged together.

Whatever asks for a comparison (each row's baseline, the experiment's ``[[comparisons]]``, a
task's expectation) hands a :class:`Request`; :func:`judge` turns the requests of one run
into :class:`Comparison` s by the rule book (:mod:`.verdicts`): the gates first, then the
paired test per request, then Holm's adjustment over every test the report draws (one
test per distinct task, model, control and split, however many asked for it), then the
labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._task import make_task
from ..experiment.store import RunResult
from .run import Row, Run
from .stats import ALPHA, Paired, detectable_difference, holm
from .verdicts import (
    INCONCLUSIVE,
    UNEQUAL_BUDGET,
    UNMATCHED_SIZE,
    budget_gap,
    flagged,
    grid_value,
    label,
    seed_values,
    size_gap,
    unsolved,
)


@dataclass(frozen=True)
class Request:
    """One comparison asked for: row ``model`` against row ``control`` (a label) or an
    analytic bound (a number), on ``split`` of ``task``; ``requires`` (for a split other
    than test) is the test metric both rows must reach first. ``kind`` says who asked:
    ``"baseline"``, ``"declared"`` or ``"expectation"``."""

    task: str
    model: str
    control: str | float
    kind: str
    split: str = "test"
    requires: float | None = None

    @property
    def key(self) -> tuple[str, str, str | float, str]:
        return self.task, self.model, self.control, self.split


@dataclass(frozen=True)
class Comparison:
    """One judged comparison: model − control on a split's metric, paired over seeds.

    ``paired`` is None where no test could be drawn (a gate closed, or a row missing);
    ``label`` is one of :data:`~.verdicts.LABELS`; ``p_adjusted`` and ``tost_adjusted`` are
    Holm-adjusted within the report; ``detectable`` is the smallest difference the test could
    have found (80% power, at the Bonferroni level of the report's family). ``grid`` gives,
    for a tuned pair, whether the model does better at each grid value (True, False, or None
    for neither). ``note`` says what limits the verdict: a gate, an out-of-distribution
    comparison moved to the trained split, failed or ⚑ seeds.
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

    @property
    def control_text(self) -> str:
        return self.control if isinstance(self.control, str) else f"{self.control:.4g}"

    @property
    def grid_holds(self) -> bool | None:
        """Whether the verdict's direction holds at every grid value (None: untuned, or no
        direction to hold)."""
        signs = [s for _, s in self.grid]
        if not signs or self.paired is None:
            return None
        overall = self.paired.better(self.higher_is_better)
        return None if overall is None else all(s == overall for s in signs)


def judge(run: Run, requests: Sequence[Request]) -> dict[tuple[str, str, str | float, str],
                                                        Comparison]:
    """Every request judged (one per key, its kinds merged), Holm-adjusted together."""
    merged: dict[tuple[str, str, str | float, str], Request] = {}
    kinds: dict[tuple[str, str, str | float, str], list[str]] = {}
    for request in requests:
        merged.setdefault(request.key, request)
        kinds.setdefault(request.key, [])
        if request.kind not in kinds[request.key]:
            kinds[request.key].append(request.kind)
    drafts = [_draw(run, request, tuple(kinds[key])) for key, request in merged.items()]
    # a comparison moved to the trained split may duplicate one drawn there: test it once
    tested: dict[tuple[Any, ...], int] = {}
    for i, c in enumerate(drafts):
        if c.paired is not None:
            tested.setdefault((c.task, c.model, c.control, c.split), i)
    family = [drafts[i] for i in tested.values()]
    adjusted = holm([c.paired.p for c in family])
    tost_adjusted = holm([c.paired.tost for c in family])
    alpha = ALPHA / max(1, sum(p is not None for p in adjusted))
    final: dict[tuple[Any, ...], Comparison] = {}
    for c, p, t in zip(family, adjusted, tost_adjusted, strict=True):
        assert c.paired is not None
        sd = c.paired.sd
        final[c.task, c.model, c.control, c.split] = replace(
            c, p_adjusted=p, tost_adjusted=t, label=label(c.paired, p, t, c.higher_is_better),
            detectable=detectable_difference(sd, c.paired.n, alpha) if sd else None)
    out = {}
    for request, c in zip(merged.values(), drafts, strict=True):
        done = final.get((c.task, c.model, c.control, c.split)) if c.paired else None
        out[request.key] = c if done is None else replace(
            done, kinds=c.kinds, asked_split=c.asked_split, note=c.note)
    return out


def _draw(run: Run, request: Request, kinds: tuple[str, ...]) -> Comparison:
    """A request's comparison before the report-wide adjustment: its gates and its test."""
    rows = run.task_rows(request.task)
    model = rows.get(request.model)
    control = rows.get(request.control) if isinstance(request.control, str) else None
    described = (model or control or next(iter(rows.values()))).described
    higher = bool(described.get("higher_is_better", False))
    base = Comparison(request.task, request.model, request.control, request.split, kinds,
                      described.get("metric", "metric"), higher, INCONCLUSIVE)
    missing = [label for label, row in ((request.model, model), (request.control, control))
               if isinstance(label, str) and row is None]
    if missing:
        return replace(base, note=f"{', '.join(missing)} not in this run")
    assert model is not None
    sides = [model.selected] + ([control.selected] if control else [])
    chosen = {"chosen": model.chosen_text(), "control_chosen": control.chosen_text()
              if control else ""}
    if control is not None:
        for closed, gap in ((UNEQUAL_BUDGET, budget_gap), (UNMATCHED_SIZE, size_gap)):
            if why := gap(*sides):
                return replace(base, label=closed, note=why, **chosen)
    split, notes = request.split, []
    if split != "test" and request.requires is not None:
        why = [w for rows_ in sides if (w := unsolved(rows_, request.requires, higher))]
        if why:
            split = "test"
            notes.append(f"{request.split} not judged: " + "; ".join(why) +
                         ", so the comparison stays on the trained split")
    margin = _margin(model.selected[0], control, request.control)
    paired = _paired(model, control, request.control, split, higher, margin, model.chosen,
                     control.chosen if control else ())
    notes += _failure_notes(model, control, paired)
    grid = _grid_signs(model, control, request.control, split, higher) if model.grid or (
        control and control.grid) else ()
    return replace(base, split=split, paired=paired, grid=grid, note="; ".join(notes),
                   asked_split=request.split if split != request.split else "", **chosen)


def _paired(model: Row, control: Row | None, bound: str | float, split: str, higher: bool,
            margin: float | None, at: tuple[Any, ...], control_at: tuple[Any, ...]) -> Paired:
    ours = seed_values(model.at(at), split)
    theirs = seed_values(control.at(control_at), split) if control else float(bound)
    return Paired.of(ours, theirs, higher, margin)


def _grid_signs(model: Row, control: Row | None, bound: str | float, split: str,
                higher: bool) -> tuple[tuple[str, bool | None], ...]:
    """Whether the model does better at each grid value: the model and the control each at
    that value where they are tuned over it, else at their chosen value."""
    tuned = model if model.grid else control
    assert tuned is not None
    values = sorted({grid_value(c, list(tuned.grid)) for c in tuned.cells})
    signs = []
    for value in values:
        at = value if model.grid == tuned.grid else model.chosen
        control_at = (value if control and control.grid == tuned.grid
                      else control.chosen if control else ())
        paired = _paired(model, control, bound, split, higher, None, at, control_at)
        text = ", ".join(f"{f}={v:g}" if isinstance(v, float) else f"{f}={v}"
                         for f, v in zip(tuned.grid, value, strict=True))
        signs.append((text, paired.better(higher)))
    return tuple(signs)


def _margin(cell: RunResult, control: Row | None, bound: str | float) -> float | None:
    """The equivalence margin the task states, at the control's mean (None against a bound:
    a model is compared with a bound to beat it, not to equal it)."""
    if control is None or "task" not in cell.config:
        return None
    values = [v for v in seed_values(control.selected).values() if v is not None]
    if not values:
        return None
    task = make_task(cell.config["task"], **cell.config.get("spec", {}))
    return task.equivalence_margin(sum(values) / len(values))


def _failure_notes(model: Row, control: Row | None, paired: Paired) -> list[str]:
    notes = []
    for row, failed in ((model, paired.failed), (control, paired.control_failed)):
        if row is not None and failed:
            notes.append(f"{row.label} fails {len(failed) + len(paired.both_failed)}/"
                         f"{paired.total} (seeds {', '.join(map(str, failed))} rank last)")
    if paired.both_failed:
        notes.append(f"both fail seed(s) {', '.join(map(str, paired.both_failed))}")
    for row in (model, control):
        if row is not None and (seeds := flagged(row.selected)):
            notes.append(f"⚑ {row.label}: ODE reconstruction failed on seed(s) "
                         f"{', '.join(map(str, seeds))} (values kept)")
    return notes
