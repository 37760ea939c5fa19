"""The report's text, shared by every renderer: each table as a header and rows of cell
text (one function per table: `comparison_cells`, `table_cells`, ...), the notes
that say how to read them, and the summary in words."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ...models.operator import REGIMES
from ..judge.comparisons import Comparison
from ..judge.crossover import interval_text, star_text
from ..judge.labels import FAILS, INCONCLUSIVE, entry
from ..judge.stats import ALPHA, PAIRED_T, POWER, SIGN_FLIP, T_MIN_PAIRS, Estimate, Paired
from ..judge.verdicts import MIN_PAIRS, SIZE_TOLERANCE
from .build import Problem, Report, TaskTable, status_text
from .wording import (
    DESCRIPTIVE,
    as_record,
    counts,
    counts_text,
    difference,
    failures,
    number,
    sentence,
    undetected,
)


def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _est(e: Estimate) -> str:
    if e.mean is None:
        return "—"
    return _num(e.mean) if e.ci is None else f"{_num(e.mean)} ± {_num(e.ci, 2)}"


def signed(p: Paired) -> str:
    """A paired mean difference, signed, with its CI half-width: ``"-0.41 ± 0.12"``."""
    return difference(p.mean, p.ci)


def _p(value: float | None) -> str:
    return "—" if value is None else ("<0.001" if value < 0.001 else f"{value:.3f}")


def _finished(finished: int, run: int) -> str:
    """``"3/3"``, or with the success rate when seeds failed: ``"3/5 (60%)"``."""
    return f"{finished}/{run}" if finished == run else f"{finished}/{run} ({finished / run:.0%})"


def _per_seed(values: dict[int, float | str]) -> str:
    """Every seed's value in seed order, a failed seed by its status: ``"1, 1, diverged"``."""
    return ", ".join(v if isinstance(v, str) else _num(v, 3) for _, v in sorted(values.items()))


def direction(higher_is_better: bool) -> str:
    """The arrow of a metric's better direction: ``"↑"`` higher, ``"↓"`` lower."""
    return "↑" if higher_is_better else "↓"


def who(problem: Problem, code: Callable[[str], str] = str) -> str:
    """Who a problem is about: the model label(s), and the seed when it is one cell's."""
    models = ", ".join(code(m) for m in problem.model.split(", "))
    return models if problem.seed is None else f"{models} seed {problem.seed}"


#: How to read the comparisons, for every renderer that shows them.
COMPARISON_NOTE = (
    "Each row against its baseline, and each comparison the experiment declares: model − "
    "control per seed (same data and initial weights per seed), each row at its own grid "
    "value chosen on val. Δ: mean ± 95% CI over the seeds both finished; n: seeds both "
    "finished (of the seeds compared, where one failed: a seed one side did not finish, or "
    "whose metric is not finite, counts as that side's worst outcome). p: the paired t-test "
    f"of the mean difference (t) from {T_MIN_PAIRS} pairs whose differences vary; the exact "
    "sign-flip test (flip) over fewer, or over differences that do not vary beyond "
    "rounding, whose p cannot fall below 2/2ⁿ; the exact signed-rank test (rank) where a "
    "seed failed; then Holm-adjusted over every test of this report whose floor can reach "
    "its Holm level (Tarone), a mirrored pair counted once; the TOST p of equivalence at "
    "the task's margin (paired-t, or exact by the same rule), raw and adjusted, with its "
    "90% t interval. win / "
    f"loss: adjusted p < {ALPHA}, in the metric's better / worse direction (↑ higher, ↓ lower "
    f"is better); equivalent: otherwise, adjusted TOST p < {ALPHA} (the 90% interval inside "
    "the margin); both solved: both rows at the metric's best value on every seed, no test; "
    "both at floor: both rows at or below the task's chance or shortcut level on every "
    "seed, no test; "
    f"fails k/n: fewer than {MIN_PAIRS} seeds both finished because a side failed; "
    f"inconclusive: neither, or fewer than {MIN_PAIRS} seeds, with the smallest difference "
    f"the test could have detected ({POWER:.0%} power, at the Bonferroni level); not "
    "significant is never equal. unequal tuning: the rows searched different grids; "
    "unequal budget: the training configs differ beyond seed and tuned fields, or a seed "
    f"stopped early; unmatched size: parameter counts more than {SIZE_TOLERANCE:.0%} apart: "
    "no test. At every grid value: whether the model's side of the difference holds with "
    "both rows at each value of the grid."
)
#: How to read the expectations.
EXPECTATION_NOTE = (
    "Each claim is a comparison of the report, drawn and Holm-adjusted with the others: "
    "confirmed by a win (a claim of better) or a loss (worse), contradicted by the opposite "
    "label or by equivalence within the task's margin, otherwise insufficient evidence, "
    "with the reason. Against a number, the one-sample test. A claim on an "
    "out-of-distribution split is judged only where its rows first reached the stated test "
    "metric on every seed."
)


def _test(paired: Paired) -> str:
    return {PAIRED_T: "t", SIGN_FLIP: "flip"}.get(paired.test, "rank")


def _n(p: Paired) -> str:
    """``n = 8``: the pairs both rows finished, ``n = 3 of 5`` where seeds failed."""
    return f"n = {p.n}" if p.n == p.total else f"n = {p.n} of {p.total}"


def _verdict(c: Comparison) -> str:
    """The label, with n, who failed and what an inconclusive test could have detected."""
    p = c.paired
    if p is None:
        return c.label
    if c.label == FAILS:
        return "; ".join(f"{side} {FAILS} {k}/{p.total}" for side, k in failures(c))
    seen = undetected(c) if c.label == INCONCLUSIVE else ""
    return f"{c.label} ({_n(p)}{'; ' + seen if seen else ''})"


def _tost(c: Comparison) -> str:
    """The TOST's raw p, its Holm-adjusted p, the margin and the 90% interval."""
    p = c.paired
    if p is None or p.margin is None or p.tost is None:
        return "—"
    low, high = p.interval or (None, None)
    return (
        f"{_p(p.tost)} → {_p(c.tost_adjusted)} (±{_num(p.margin, 2)}; 90% "
        f"[{_num(low, 2) if low is not None and math.isfinite(low) else '−∞'}, "
        f"{_num(high, 2) if high is not None and math.isfinite(high) else '∞'}])"
    )


def _grid(c: Comparison) -> str:
    """``"holds (3/3)"``, or the grid values where the model's side flips or evens out."""
    holds = c.grid_holds
    if holds is None:
        return "—"
    if holds:
        return f"holds ({len(c.grid)}/{len(c.grid)})"
    overall = c.paired.better(c.higher_is_better) if c.paired else None
    flips = [text for text, sign in c.grid if sign is not None and sign != overall]
    even = [text for text, sign in c.grid if sign is None]
    return "; ".join(
        part
        for part in (
            flips and "flips at " + ", ".join(flips),
            even and "no difference at " + ", ".join(even),
        )
        if part
    )


def comparison_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per comparison: the paired difference, its tests and its label."""
    head = [
        "task",
        "model",
        "control",
        "chosen",
        "Δ (model − control)",
        "p",
        "p Holm",
        "TOST p → Holm (margin; 90% interval)",
        "verdict",
        "at every grid value",
        "note",
    ]
    rows = []
    for c in report.comparisons:
        p = c.paired
        split = "" if c.split == "test" else f", {c.split}"
        chosen = " / ".join(t or "—" for t in (c.chosen, c.control_chosen))
        rows.append(
            [
                f"{c.task} ({c.metric} {direction(c.higher_is_better)}{split})",
                c.model,
                c.control_text,
                chosen if chosen != "— / —" else "—",
                "—" if p is None else signed(p),
                "—" if p is None or p.p is None else f"{_p(p.p)} ({_test(p)})",
                _p(c.p_adjusted),
                _tost(c),
                _verdict(c),
                _grid(c),
                c.note or "—",
            ]
        )
    return head, rows


def table_cells(table: TaskTable) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one task's table, shared by the text and HTML renderers."""
    arrow = direction(table.higher_is_better)
    head = [
        "model",
        "n",
        *(["chosen"] if table.tuned else []),
        f"test {arrow}",
        "test per seed",
        *([f"val {arrow}"] if table.has_val else []),
        f"train {arrow}",
        *(f"{s} {arrow}" for s in table.ood_splits),
        *table.extras,
        "params (× baseline)",
        "matmul FLOPs/sample",
        "NFE fwd/bwd",
        "time (s)",
        "status",
    ]
    rows = []
    for r in table.rows:
        nfe = (
            "—" if r.nfe_forward is None else f"{_num(r.nfe_forward, 3)}/{_num(r.nfe_backward, 3)}"
        )
        params = _num(r.params, 6)
        if r.params_ratio is not None:
            params += f" ({r.params_ratio:.2f}×)"
        n = _finished(r.finished, r.run) + (f", {r.retries} retried" if r.retries else "")
        rows.append(
            [
                r.model + (" ⚑" if r.flagged else ""),
                n,
                *([r.chosen or "—"] if table.tuned else []),
                _est(r.test),
                _per_seed(r.per_seed),
                *([_est(r.val)] if table.has_val else []),
                _est(r.train),
                *(_est(r.ood[s]) for s in table.ood_splits),
                *(_est(r.extra[e]) for e in table.extras),
                params,
                _num(r.flops, 3),
                nfe,
                _num(r.wall_time, 3),
                status_text(r.statuses),
            ]
        )
    return head, rows


def flag_notes(table: TaskTable) -> list[str]:
    """One line per flagged model: the seeds whose ODE solve failed its reconstruction check."""
    return [
        f"⚑ {r.model}: on seed(s) {', '.join(map(str, r.flagged))} the ODE reconstruction "
        "error (0 → T → 0) exceeded its tolerance: the solver, not only the model, shaped "
        "the result"
        for r in table.rows
        if r.flagged
    ]


def expectation_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task expectation: claim, reason, n, difference, p, verdict and why."""
    head = [
        "task",
        "claim",
        "reason",
        "model / control",
        "n",
        "Δ (model − control)",
        "p Holm",
        "verdict",
        "note",
    ]
    rows = []
    for v in report.expectations:
        p = v.comparison.paired if v.comparison else None
        matched = " / ".join(label for label in (v.model, v.control) if label) or "—"
        rows.append(
            [
                f"{v.task} ({direction(v.higher_is_better)})",
                v.claim,
                v.expectation.reason,
                matched,
                "—" if p is None else _n(p),
                "—" if p is None else signed(p),
                "—" if v.comparison is None else _p(v.comparison.p_adjusted),
                v.verdict,
                v.note or "—",
            ]
        )
    return head, rows


#: What the regime audit pools, said once for every renderer.
REGIME_NOTE = (
    "Share of (sample, layer) gates per regime on the test split, pooled over seeds, "
    "for the stacks with the erase term, `ddl` and `ddl-transformer` (for a "
    "Transformer a sample is a token and a layer a sublayer); the write-only "
    "controls are left out, their β only scales a write."
)


#: How to read the crossover tables.
CROSSOVER_NOTE = (
    "Where the run sweeps a task's knob (e.g. the event rate p), every comparison above "
    "followed across the knob: at each value the paired difference (mean ± 95% CI over the "
    "seeds both finished) and its adjusted label with n. The crossover, named after the "
    "knob (p*, hops*), is the smallest knob value from which on the model wins at every "
    "larger value in the run (none in range: it does not win at the largest); it reads "
    "adjusted verdicts, so one point that misses significance moves it. Beside it, the 95% "
    "bootstrap interval over seeds of the knob value from which on the mean difference "
    "favours the model (none: beyond the range)."
)


def crossover_cells(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per swept task family: a title, a header and one row per setting × model × control
    with ``p*`` and the judged comparison at every knob value."""
    tables = []
    for family in dict.fromkeys(c.setting.family for c in report.crossovers):
        found = [c for c in report.crossovers if c.setting.family == family]
        first = found[0]
        values = sorted({v for c in found for v, _ in c.points})
        head = [
            "setting",
            "model − control",
            "crossover",
            "sign crossover (bootstrap)",
            *(f"{first.setting.knob} = {v:g}" for v in values),
        ]
        rows = []
        for c in found:
            at = dict(c.points)
            rows.append(
                [
                    c.setting.label or "—",
                    f"{c.model} − {c.control}",
                    star_text(c.star, c.setting.knob),
                    interval_text(c.interval),
                    *(_point(at[v]) if v in at else "—" for v in values),
                ]
            )
        title = (
            f"{family}: test {first.metric} {direction(first.higher_is_better)} "
            f"against {first.setting.knob}"
        )
        tables.append((title, head, rows))
    return tables


def _point(c: Comparison) -> str:
    return c.label if c.paired is None else f"{signed(c.paired)} ({_verdict(c)})"


def regime_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task × Delta stack: share of gates per regime, dominant vs stated."""
    head = ["task", "model", *REGIMES, "dominant", "stated", "share in stated"]
    rows = []
    for r in report.regimes:
        share = r.share_stated
        rows.append(
            [
                r.task,
                r.model,
                *(f"{r.fractions[g]:.0%}" for g in REGIMES),
                r.dominant,
                " / ".join(r.stated) or "(control)",
                "—" if share is None else f"{share:.0%}",
            ]
        )
    return head, rows


#: What the stream-mixing audit measures, said once for every renderer.
MIXING_NOTE = (
    f"{DESCRIPTIVE}. For every layer of every seed, the static stream-mixing matrix H of the "
    "trained weights (`hc`: the weights; `mhc`: their Sinkhorn projection, doubly "
    "stochastic): its Frobenius distance to the identity I (0: no stream is mixed into "
    "another) and to the same cell's H at initialisation, H_init (0: training "
    "left it where it started), mean and max over layers and seeds. H_init is I for `hc` but "
    "not for `mhc`: Sinkhorn reads the identity weights as logits and mixes from the start "
    "(e/(e+n−1) on the diagonal, 1/(e+n−1) elsewhere, for n streams). The state-dependent "
    "term the stacks add to H at every step is not included."
)


def mixing_cells(rows: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """One row per task × stream-mixing stack (a `MixingRow`, or its JSON dict): how far its
    mixing matrices moved from the identity and from their start."""
    head = [
        "task",
        "model",
        "streams",
        "seeds",
        "‖H − I‖ mean",
        "‖H − I‖ max",
        "‖H − H_init‖ mean",
        "‖H − H_init‖ max",
        "‖H_init − I‖",
    ]
    keys = ("from_identity", "from_identity_max", "from_start", "from_start_max", "start")
    return head, [
        [
            r["task"],
            r["model"],
            str(r["streams"]),
            str(r["seeds"]),
            *(number(r[k], 3) for k in keys),
        ]
        for r in map(as_record, rows)
    ]


#: Where no row searched a grid.
UNTUNED_NOTE = (
    "No row was tuned: every row trained at the rates the experiment fixed, not "
    "each at its own best, so a verdict here may change at another rate."
)


def untuned(report: Report) -> bool:
    """Whether no row of the report searched a grid: its verdicts rest on fixed rates."""
    return bool(report.tables) and not any(r.chosen for t in report.tables for r in t.rows)


#: How to read the tables per task.
TABLE_NOTE = (
    "Each row at its chosen grid value (chosen: the value with the best mean val metric; "
    "grid edge: the smallest or largest of three or more searched numbers, so the row's best "
    "may lie beyond the grid and its result be understated). n: "
    "seeds that finished / seeds run (retried: earlier attempts, listed below the table); "
    "mean ± 95% CI over the finished seeds (a bare mean: one seed), every seed's value "
    "beside it; ↑/↓: higher/lower is better; params × baseline: the ratio to the baseline's "
    "parameter count; matmul FLOPs/sample: forward FLOPs of matmuls, convolutions and "
    "attention as torch's FLOP counter counts them (elementwise work, the Delta update's "
    "included, is not counted), per sample of one val batch."
)


def matrix_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """The verdict matrix as a table: one row per task, one column per model, each cell the
    label of the model against its baseline (blank: the baseline itself, or not run)."""
    against = [c for c in report.comparisons if "baseline" in c.kinds]
    models = list(dict.fromkeys(c.model for c in against))
    labels = {(c.task, c.model): c.label for c in against}
    tasks = list(dict.fromkeys(c.task for c in against))
    return (
        ["task", *models],
        [[task, *(labels.get((task, m), "") for m in models)] for task in tasks],
    )


def summary_lines(report: Report) -> list[str]:
    """The results in words: one sentence per comparison decided (win, loss, equivalent:
    a label that shows something) or declared, then how many others are inconclusive or
    untested."""
    stated = [c for c in report.comparisons if "declared" in c.kinds or entry(c.label).shows]
    rest = [c for c in report.comparisons if c not in stated]
    lines = [sentence(c) for c in stated]
    if rest:
        lines.append(
            f"The other {len(rest)} comparisons: {counts_text(counts(rest))}; see the table below."
        )
    return lines


def lead_text(report: Report) -> str:
    """What kind of run it is, from the experiment's description."""
    return report.description or "The experiment file gives no description of this run."
