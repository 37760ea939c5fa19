"""The rule book: every rule that turns measured seeds into words, in one place.

A *comparison* is one row against a control on one task and split: its baseline, a
comparison the experiment declares, a contrast the suite always draws, or a task's stated
expectation. It reads, in this order:

1. **unequal budget** (:func:`budget_gap`): the two rows' resolved training configs differ
   in more than seed, device and the tuned fields, or a finished cell trained fewer steps
   than its budget (an early stop): no test is drawn.
2. **unmatched size** (:func:`size_gap`): parameter counts more than
   :data:`SIZE_TOLERANCE` apart: no test is drawn.
3. An out-of-distribution comparison needs both rows to have solved the trained split on
   every seed (:func:`unsolved`); otherwise it is drawn on the trained split instead.
4. The paired test (:class:`~.stats.Paired`): a seed one side did not finish counts as that
   side's worst outcome; with fewer than :data:`MIN_PAIRS` seeds, **inconclusive**.
5. Within a report every drawn p-value is Holm-adjusted (:func:`~.stats.holm`), the
   equivalence p-values as a family of their own. **equivalent**: the adjusted TOST p at the
   task's margin is below :data:`~.stats.ALPHA`, a difference within the margin being what
   the task counts as none (so a significant but smaller difference also reads
   equivalent); **win** / **loss**: otherwise, the adjusted p below ALPHA, in the metric's
   better / worse direction; **inconclusive** otherwise, with n and the smallest difference
   the test could have detected. Never "tie": not significant is not equal.

A tuned row's results are those of the grid value with the best mean val metric
(:func:`chosen_value`), and every verdict says whether its direction holds at every grid
value. A task's expectation is confirmed by the matching label, contradicted by the
opposite one or by equivalence (:func:`claim_verdict`). An ODE seed whose reconstruction
check failed (⚑) counts with its measured value, which its model computed whatever the
solver did, and every verdict that involves one names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..experiment.config import COUNTED
from ..experiment.store import RunResult
from .stats import ALPHA, Paired

WIN, LOSS, EQUIVALENT, INCONCLUSIVE = "win", "loss", "equivalent", "inconclusive"
UNEQUAL_BUDGET, UNMATCHED_SIZE = "unequal budget", "unmatched size"
#: Every label a comparison can carry; the first four are drawn from a test.
LABELS = (WIN, LOSS, EQUIVALENT, INCONCLUSIVE, UNEQUAL_BUDGET, UNMATCHED_SIZE)
CONFIRMED, CONTRADICTED, INSUFFICIENT = "confirmed", "contradicted", "insufficient evidence"
#: Fewest seeds a verdict rests on: below it, inconclusive whatever the p-value.
MIN_PAIRS = 3
#: Largest relative difference in parameter count between two compared rows.
SIZE_TOLERANCE = 0.10
#: Training fields that never make budgets unequal: who trains (seed, device) and the
#: solver cap, which is the ODE model's own option (``max_steps``) where it applies.
_NOT_BUDGET = ("device", "ode_max_steps")


def grid_value(row: RunResult, fields: Sequence[str]) -> tuple[Any, ...]:
    """A cell's values of the tuned ``fields``: its point on its row's grid."""
    train = row.config.get("train", {})
    return tuple(train.get(f) for f in fields)


def chosen_value(cells: Sequence[RunResult], fields: Sequence[str]) -> tuple[Any, ...]:
    """The grid value a tuned row is reported at: the one whose seeds finished most often,
    then the best mean val metric over them (the first in grid order on a tie). Test data
    plays no part."""
    by_value: dict[tuple[Any, ...], list[RunResult]] = {}
    for cell in cells:
        by_value.setdefault(grid_value(cell, fields), []).append(cell)

    def merit(value: tuple[Any, ...]) -> tuple[int, float]:
        vals = [c.metrics.get("val") for c in by_value[value] if c.status in COUNTED]
        vals = [v for v in vals if isinstance(v, int | float)]
        if not vals:
            return 0, float("-inf")
        mean = sum(vals) / len(vals)
        higher = bool(by_value[value][0].metrics.get("higher_is_better", False))
        return len(vals), mean if higher else -mean

    return max(by_value, key=merit)


def budget_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows' cells cannot be compared (``"ddl lr=0.03; resnet lr=0.003"``), or
    empty where every cell of both trained on the same budget: the whole training config
    but seed, device and the fields either row tunes, and, for every finished cell, all the
    steps it was given (an early stop is a smaller budget)."""
    tuned = {f for r in (*model, *control) for f in r.config.get("tune", {})}
    settings: dict[str, dict[str, set[str]]] = {}
    for r in (*model, *control):
        for name, value in r.config.get("train", {}).items():
            if name not in tuned and name not in _NOT_BUDGET:
                settings.setdefault(r.model, {}).setdefault(name, set()).add(json.dumps(value))
    names = sorted({n for s in settings.values() for n in s})
    differ = [n for n in names
              if len(set().union(*(s.get(n, {"null"}) for s in settings.values()))) > 1]
    notes = []
    if differ:
        notes.append("; ".join(
            f"{label} " + ", ".join(f"{n}={'/'.join(sorted(s.get(n, {'null'})))}" for n in differ)
            for label, s in settings.items()))
    for label in dict.fromkeys(r.model for r in (*model, *control)):
        stopped = [r for r in (*model, *control) if r.model == label and r.status in COUNTED
                   and r.metrics.get("steps") is not None
                   and r.metrics["steps"] < r.config.get("train", {}).get("steps", 0)]
        if stopped:
            steps = ", ".join(str(r.metrics["steps"]) for r in stopped)
            notes.append(f"{label} stopped early on {len(stopped)} seed(s) at {steps} steps")
    return "; ".join(notes)


def size_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows are not of a size (``"ddl has 18,916 parameters, node 2,628: more than
    10% apart"``), or empty where their parameter counts lie within
    :data:`SIZE_TOLERANCE` of the control's."""
    counts = [max((r.params for r in rows if r.params), default=None) for rows in (model,
                                                                               control)]
    if None in counts or abs(counts[0] - counts[1]) <= SIZE_TOLERANCE * counts[1]:
        return ""
    return (f"{model[0].model} has {counts[0]:,} parameters, {control[0].model} "
            f"{counts[1]:,}: more than {SIZE_TOLERANCE:.0%} apart")


def unsolved(rows: Sequence[RunResult], requires: float, higher_is_better: bool) -> str:
    """Why a row has not solved its trained split (``"ddl-lin-bmax1 reached test ≥ 0.99 on
    0 of 8 seeds"``), or empty where every seed reached ``requires``: an extrapolation is
    judged only between rows that first fit what they were trained on."""
    values = [r.metrics.get("test") if r.status in COUNTED else None for r in rows]
    solved = sum(isinstance(v, int | float) and (v >= requires if higher_is_better
                                                 else v <= requires) for v in values)
    if values and solved == len(values):
        return ""
    sign = "≥" if higher_is_better else "≤"
    return f"{rows[0].model} reached test {sign} {requires:.4g} on {solved} of {len(values)} seeds"


def label(paired: Paired, p_adjusted: float | None, tost_adjusted: float | None,
          higher_is_better: bool) -> str:
    """The label of a drawn test (rule 5 above)."""
    if paired.total < MIN_PAIRS:
        return INCONCLUSIVE
    if tost_adjusted is not None and tost_adjusted < ALPHA:
        return EQUIVALENT
    better = paired.better(higher_is_better)
    if p_adjusted is not None and p_adjusted < ALPHA and better is not None:
        return WIN if better else LOSS
    return INCONCLUSIVE


def claim_verdict(label_: str, relation: str) -> str:
    """A task's claim (``relation``: ``"better"`` or ``"worse"``) judged by the label of
    its comparison: the matching label confirms it, the opposite one or equivalence
    contradicts it, anything else leaves it open."""
    if label_ in (WIN, LOSS):
        return CONFIRMED if (label_ == WIN) == (relation == "better") else CONTRADICTED
    return CONTRADICTED if label_ == EQUIVALENT else INSUFFICIENT


def seed_values(rows: Sequence[RunResult], split: str = "test") -> dict[int, float | None]:
    """Seed → metric on ``split``, or None for a seed that did not finish (a failure, never
    dropped); a finished seed without a value there (a split its model cannot run) is left
    out."""
    found: dict[int, float | None] = {}
    for r in rows:
        if r.status not in COUNTED:
            found[r.seed] = None
            continue
        value = (r.metrics.get(split) if split in ("train", "val", "test")
                 else r.metrics.get("ood", {}).get(split))
        if isinstance(value, int | float):
            found[r.seed] = float(value)
    return found


def flagged(rows: Sequence[RunResult]) -> tuple[int, ...]:
    """The seeds whose ODE reconstruction check failed (⚑), see the module docstring."""
    return tuple(sorted(r.seed for r in rows if r.metrics.get("reconstruction_flag")))
