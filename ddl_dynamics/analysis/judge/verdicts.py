"""The rule book: every rule that turns measured seeds into words, in one place.

A *comparison* is one row against a control on one task and split: its baseline, a
comparison the experiment declares, a contrast the suite always draws, or a task's stated
expectation. It reads, in this order:

1. **unequal tuning** (`tuning_gap`): the two rows searched different grids (or one
   searched and the other did not). Val and test score the same trained network, so the
   best of several rates carries a winner's curse a fixed rate does not: no test is drawn.
2. **unequal budget** (`budget_gap`): the two rows' resolved training configs differ
   in more than seed, device, the tuned fields and the fields that do not change training
   (``eval_every``, ``max_seconds``, ``compile``; ``bf16`` unless both rows ran on CUDA,
   where alone autocast applies it), or
   a finished cell trained fewer steps than its budget (an early stop): no test is drawn.
3. **unmatched size** (`size_gap`): parameter counts more than
   `SIZE_TOLERANCE` apart, of the smaller: no test is drawn. A declared comparison whose
   control is larger on purpose (``control_larger``, a baseline of more compute) asks
   instead that the control has at least the model's parameters and forward FLOPs
   (`smaller_control`), and its note states both ratios (`larger`).
4. An out-of-distribution comparison needs both rows to have solved the trained split on
   every seed (`unsolved`, at the strictest ``requires`` asked); otherwise it is drawn
   on the trained split instead.
5. The paired test of the mean difference (`Paired`): the paired t-test where at least
   `T_MIN_PAIRS` seeds both finished and their differences vary beyond rounding, else the
   exact sign-flip test, whose p cannot fall below 2/2ⁿ (a t statistic over constant
   differences is infinite, and a p of 0 would survive any family); a seed one side did
   not finish (or whose metric is not finite) counts as that side's worst outcome, and
   then the exact signed-rank test decides. With fewer than `MIN_PAIRS` seeds both
   finished, **fails k/n** where a side failed, else **inconclusive**. **both solved**:
   both rows at the metric's best value (`METRIC_BEST`) on every seed, a ceiling that says
   the task cannot tell them apart; **both at floor**: both rows at or below the task's
   chance or shortcut level (`Task.floor`) on every seed, within the task's margin there
   or, for an accuracy, within the sampling spread of a model that scores the floor on the
   test split (`comparisons.floor_band`), neither doing the task: no test either.
6. Within a report every other drawn p-value is Holm-adjusted (`holm`), the
   equivalence p-values as a family of their own; a mirrored pair (a vs b, b vs a) is one
   test, and a test whose floor cannot reach its Holm level does not count in the family
   (Tarone's rule, `tarone`): it reads inconclusive, and says why. **equivalent**: the
   adjusted TOST p at the task's margin below ALPHA (the 90% interval inside the margin), a
   difference within the margin being what the task counts as none (a significant but
   smaller one is named in the note and flagged); **win** / **loss**: otherwise, the
   adjusted p below ALPHA, in the metric's better / worse direction; **inconclusive**
   otherwise, with n and the smallest difference the test could have detected. Never
   "tie": not significant is not equal.

A tuned row's results are those of the grid value with the best mean val metric in its
task's direction (`chosen_value`), and every verdict says whether its direction holds
at every grid value. A task's expectation is confirmed by the matching label, contradicted
by the opposite one or by equivalence without a significant difference its way
(`claim_verdict`); a comparison of two rows at the floor leaves it open. An ODE seed whose
reconstruction check failed (⚑) counts with its measured value, which its model computed
whatever the solver did, and every verdict that involves one names it.

What each label means, the words and colours it is shown in and what it decides are in
`labels`, one entry per label; the rules that give them are here (`GATES`, `label`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ...experiment.config import COUNTED
from ...experiment.grid import searched, value_text
from ...experiment.result import RunResult
from .labels import (
    AT_FLOOR,
    BETTER,
    BOTH_SOLVED,
    EQUAL,
    EQUIVALENT,
    FAILS,
    INCONCLUSIVE,
    LOSS,
    UNEQUAL_BUDGET,
    UNEQUAL_TUNING,
    UNMATCHED_SIZE,
    WIN,
    WORSE,
    entry,
)
from .labels import LABELS as LABELS
from .stats import ALPHA, Paired, finite

CONFIRMED, CONTRADICTED, INSUFFICIENT = "confirmed", "contradicted", "insufficient evidence"
#: Fewest seeds both rows finished that any label but "fails k/n" rests on.
MIN_PAIRS = 3
#: Largest relative difference in parameter count between two compared rows.
SIZE_TOLERANCE = 0.10
#: The best value of each metric: a row there on every seed has solved the task.
METRIC_BEST = {"accuracy": 1.0, "mse": 0.0}
#: Training fields that never make budgets unequal: who trains (device) and what only
#: watches training (how often val is scored, the safety net in seconds), or how its steps
#: run (compiled or eager).
_NOT_BUDGET = ("device", "eval_every", "max_seconds", "compile")


def _grid(rows: Sequence[RunResult]) -> dict[str, list[Any]]:
    return searched(rows[0].config) if rows else {}


def tuning_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows were not tuned alike (``"ddl searched lr=0.001/0.01; resnet none"``), or
    empty where both searched the same grid (the same values of the same fields, in any
    order), or neither searched."""
    grids = [_grid(rows) for rows in (model, control)]
    as_sets = [{f: sorted(map(json.dumps, values)) for f, values in grid.items()} for grid in grids]
    if as_sets[0] == as_sets[1]:
        return ""

    def text(rows: Sequence[RunResult], grid: dict[str, list[Any]]) -> str:
        searched = "; ".join(
            f + "=" + "/".join(map(value_text, values)) for f, values in sorted(grid.items())
        )
        return f"{rows[0].model} searched {searched}" if grid else f"{rows[0].model} none"

    return "; ".join(text(rows, grid) for rows, grid in zip((model, control), grids, strict=True))


def _ode(rows: Sequence[RunResult]) -> bool:
    """Whether a row's model solves an ODE (its cells report the solver's test NFE)."""
    return any("nfe_test" in r.metrics for r in rows)


def _budget(r: RunResult, exempt: set[str]) -> dict[str, Any]:
    """A cell's training fields that set its budget."""
    return {
        name: value
        for name, value in r.config.get("train", {}).items()
        if name not in exempt and name not in _NOT_BUDGET
    }


def _on_cuda(r: RunResult) -> bool:
    return str(r.config.get("train", {}).get("device", "cpu")).startswith("cuda")


def budget_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows' cells cannot be compared (``"ddl lr=0.03; resnet lr=0.003"``), or
    empty where every cell of both trained on the same budget: the whole training config
    but seed, device, the fields both rows tune and those that only watch training, and,
    for every finished cell, all the steps it was given (an early stop is a smaller
    budget). The solver cap ``ode_max_steps`` counts between two ODE rows, where it
    applies, and ``bf16`` where every cell ran on CUDA, the one device where autocast
    applies it (elsewhere it follows the device, not the budget)."""
    tuned = set(_grid(model)) & set(_grid(control))
    exempt = tuned | ({"ode_max_steps"} if not (_ode(model) and _ode(control)) else set())
    exempt |= set() if all(map(_on_cuda, (*model, *control))) else {"bf16"}
    settings: dict[str, dict[str, set[str]]] = {}
    for r in (*model, *control):
        for name, value in _budget(r, exempt).items():
            settings.setdefault(r.model, {}).setdefault(name, set()).add(json.dumps(value))
    names = sorted({n for s in settings.values() for n in s})
    differ = [
        n for n in names if len(set().union(*(s.get(n, {"null"}) for s in settings.values()))) > 1
    ]
    notes = []
    if differ:
        notes.append(
            "; ".join(
                f"{label} "
                + ", ".join(f"{n}={'/'.join(sorted(s.get(n, {'null'})))}" for n in differ)
                for label, s in settings.items()
            )
        )
    for label in dict.fromkeys(r.model for r in (*model, *control)):
        stopped = [
            r
            for r in (*model, *control)
            if r.model == label
            and r.status in COUNTED
            and r.metrics.get("steps") is not None
            and r.metrics["steps"] < r.config.get("train", {}).get("steps", 0)
        ]
        if stopped:
            steps = ", ".join(str(r.metrics["steps"]) for r in stopped)
            notes.append(f"{label} stopped early on {len(stopped)} seed(s) at {steps} steps")
    return "; ".join(notes)


def _size(rows: Sequence[RunResult]) -> tuple[int | None, float | None]:
    """A row's parameters and forward FLOPs per sample (None where no cell counted them)."""
    params = max((r.params for r in rows if r.params), default=None)
    return params, max((r.flops for r in rows if r.flops), default=None)


def size_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows are not of a size (``"ddl has 18,916 parameters, node 2,628: more than
    10% apart"``), or empty where their parameter counts lie within
    `SIZE_TOLERANCE` of the smaller, whichever row is the control."""
    ours, theirs = _size(model)[0], _size(control)[0]
    if ours is None or theirs is None or abs(ours - theirs) <= SIZE_TOLERANCE * min(ours, theirs):
        return ""
    return (
        f"{model[0].model} has {ours:,} parameters, {control[0].model} "
        f"{theirs:,}: more than {SIZE_TOLERANCE:.0%} apart"
    )


def smaller_control(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why a control declared larger is not (``"transformer-w40 has fewer FLOPs per
    sample than ddl-dv4"``), or empty where it has at least the model's parameters and
    forward FLOPs."""
    for i, what in enumerate(("parameters", "FLOPs per sample")):
        ours, theirs = _size(model)[i], _size(control)[i]
        if ours is None or theirs is None:
            return f"{what} not counted: the control cannot be shown larger"
        if theirs < ours:
            return f"{control[0].model} has fewer {what} than {model[0].model}"
    return ""


def larger(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """A larger control's size against the model's: ``"control larger on purpose: 1.52×
    the parameters, 1.44× the forward FLOPs"``."""
    (p, f), (cp, cf) = _size(model), _size(control)
    assert p and f and cp and cf
    return (
        f"control larger on purpose: {cp / p:.2f}× the parameters, {cf / f:.2f}× the forward FLOPs"
    )


Gate = Callable[[Sequence[RunResult], Sequence[RunResult]], str]
#: The gates of rules 1–3, in order: the label each closes with, and why it is closed
#: (empty where it is open).
GATES: tuple[tuple[str, Gate], ...] = (
    (UNEQUAL_TUNING, tuning_gap),
    (UNEQUAL_BUDGET, budget_gap),
    (UNMATCHED_SIZE, size_gap),
)


def gates(control_larger: bool = False) -> tuple[tuple[str, Gate], ...]:
    """The gates a comparison passes: `GATES`, or where its control is larger on purpose
    the size gate that asks it to be (`smaller_control`)."""
    if not control_larger:
        return GATES
    return tuple((name, smaller_control if name == UNMATCHED_SIZE else gap) for name, gap in GATES)


def requirement(metric: str, requires: float, higher_is_better: bool) -> str:
    """A ``requires`` threshold in its metric's own terms: ``"test accuracy ≥ 0.99"``."""
    return f"test {metric} {'≥' if higher_is_better else '≤'} {requires:.4g}"


def strictest(thresholds: Sequence[float], higher_is_better: bool) -> float:
    """The hardest of several ``requires`` thresholds on one metric."""
    return max(thresholds) if higher_is_better else min(thresholds)


def unsolved(
    rows: Sequence[RunResult], requires: float, higher_is_better: bool, metric: str = "metric"
) -> str:
    """Why a row has not solved its trained split (``"ddl-lin-bmax1 reached test accuracy
    ≥ 0.99 on 0 of 8 seeds"``), or empty where every seed reached ``requires``: an
    extrapolation is judged only between rows that first fit what they were trained on."""
    values = list(seed_values(rows, "test").values())
    solved = sum(
        v is not None and (v >= requires if higher_is_better else v <= requires) for v in values
    )
    if values and solved == len(values):
        return ""
    return (
        f"{rows[0].model} reached {requirement(metric, requires, higher_is_better)} "
        f"on {solved} of {len(values)} seeds"
    )


def both_solved(
    model: dict[int, float | None], control: dict[int, float | None] | float, metric: str
) -> bool:
    """Whether both sides sit at the metric's best value on every seed compared (a ceiling:
    at least `MIN_PAIRS` seeds, none failed)."""
    best = METRIC_BEST.get(metric)
    theirs = control if isinstance(control, dict) else dict.fromkeys(model, control)
    seeds = set(model) & set(theirs)
    return (
        best is not None
        and len(seeds) >= MIN_PAIRS
        and all(model[s] == best and theirs[s] == best for s in seeds)
    )


def at_floor(
    model: dict[int, float | None],
    control: dict[int, float | None],
    floor: float | None,
    tolerance: float,
    higher_is_better: bool,
) -> bool:
    """Whether both rows sit at or beyond the task's floor, on its bad side, on every seed
    compared (at least `MIN_PAIRS`; within ``tolerance`` above it for a metric better
    higher, below it for one better lower; a seed that failed is at the floor too)."""
    seeds = set(model) & set(control)
    if floor is None or len(seeds) < MIN_PAIRS:
        return False
    bound = floor + tolerance if higher_is_better else floor - tolerance
    return all(
        v is None or (v <= bound if higher_is_better else v >= bound)
        for s in seeds
        for v in (model[s], control[s])
    )


def label(
    paired: Paired,
    p_adjusted: float | None,
    tost_adjusted: float | None,
    higher_is_better: bool,
    solved: bool = False,
    floored: bool = False,
) -> str:
    """The label of a drawn test (rules 5 and 6 above)."""
    if paired.n < MIN_PAIRS:
        return FAILS if paired.total > paired.n else INCONCLUSIVE
    if solved:
        return BOTH_SOLVED
    if floored:
        return AT_FLOOR
    if tost_adjusted is not None and tost_adjusted < ALPHA:
        return EQUIVALENT
    better = paired.better(higher_is_better)
    if p_adjusted is not None and p_adjusted < ALPHA and better is not None:
        return WIN if better else LOSS
    return INCONCLUSIVE


def claim_verdict(label_: str, relation: str, significant: bool | None = None) -> str:
    """A task's claim (``relation``: ``"better"`` or ``"worse"``) judged by the label of
    its comparison: the matching label confirms it, the opposite one contradicts it, and
    so does equivalence, unless the difference test found the claimed side significantly
    ahead (``significant``: whether a significant difference favours the model, None where
    none is), by less than the margin: that leaves it open, as does anything else (a
    shared ceiling or floor included)."""
    shows = entry(label_).shows
    if shows in (BETTER, WORSE):
        return CONFIRMED if shows == relation else CONTRADICTED
    if shows == EQUAL:
        return INSUFFICIENT if significant == (relation == BETTER) else CONTRADICTED
    return INSUFFICIENT


def _value(r: RunResult, split: str) -> object:
    return (
        r.metrics.get(split)
        if split in ("train", "val", "test")
        else r.metrics.get("ood", {}).get(split)
    )


def seed_values(rows: Sequence[RunResult], split: str = "test") -> dict[int, float | None]:
    """Seed → metric on ``split``, or None for a seed that did not finish, whose metric
    there is not finite, or whose model hit the solver cap scoring it (a failure, never
    dropped); a finished seed without a value there (a split its model cannot run) is left
    out."""
    found: dict[int, float | None] = {}
    for r in rows:
        value = _value(r, split)
        if r.status not in COUNTED or split in r.metrics.get("capped", {}):
            found[r.seed] = None
        elif finite(value):
            found[r.seed] = float(value)
        elif isinstance(value, int | float):
            found[r.seed] = None
    return found


def non_finite(rows: Sequence[RunResult], split: str = "test") -> tuple[int, ...]:
    """The finished seeds whose metric on ``split`` is NaN or ∞, counted as failures."""
    return tuple(
        sorted(
            r.seed
            for r in rows
            if r.status in COUNTED
            and isinstance(v := _value(r, split), int | float)
            and not finite(v)
        )
    )


def flagged(rows: Sequence[RunResult]) -> tuple[int, ...]:
    """The seeds whose ODE reconstruction check failed (⚑), see the module docstring."""
    return tuple(sorted(r.seed for r in rows if r.metrics.get("reconstruction_flag")))
