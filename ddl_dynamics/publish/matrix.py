"""The labels matrix: every finding of the studies the finding reads, at a glance.

One table per question of the finding (`finding.question`), a row per pair of rows (the
Delta row first), a column per study and task: a cell holds the label read from the first
row's side, with its size where a test decided it, so that where a Delta row wins, loses or
nothing was detected reads across studies. The studies are those the README's finding
reads (`finding.in_finding`: tuned, judged from the cells they ship); the others are named
below the tables with why they are outside. Each test once, as the finding counts it; a
comparison no test was drawn for is shown with its label (`study_findings` with
``untested``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.judge.verdicts import EQUIVALENT, INCONCLUSIVE, LOSS, WIN
from ..analysis.report.wording import difference, number
from .finding import (
    NO_CROSSOVER,
    QUESTIONS,
    WITHIN_MARGIN,
    Finding,
    capital,
    in_finding,
    outside,
    study_findings,
)
from .study_page import GENERATED, markdown_table, natural

#: The page's file name in ``docs/studies/`` (no study may take it).
PAGE = "labels.md"
#: What the page says it shows, above its tables.
INTRO = (
    "Every finding of the studies the README's finding reads (tuned, judged from the cells "
    "they ship by today's rules), at a glance: a table per question, a row per pair of rows "
    "(the Delta row first), a column per study and task (its metric, ↑ higher or ↓ lower is "
    "better). A cell is the label read from the first row's side (**win**: the first row is "
    "better) with its size: for a win, a loss or a significant difference within the margin, "
    "the paired difference first − second, mean ± 95% CI over seeds; for inconclusive (no "
    "difference detected), the smallest difference its test could have detected (±x); for "
    "equivalent, the task's margin. A comparison no test was drawn for shows why (both "
    "solved, both at floor, unmatched size, …). Each test once, as the finding counts it; "
    "each study's page states every comparison, in words."
)

Column = tuple[str, str]


def cell(f: Finding) -> str:
    """A finding as a matrix cell: its label, bold where it decides a direction, and its
    size where a test decided it."""
    bold = f"**{f.label}**" if f.label in (WIN, LOSS) else f.label
    if f.crossover is not None:
        knob, star = f.crossover["setting"]["knob"], f.crossover.get("star")
        if star is not None:
            return f"{bold} from {knob}* = {star:g}"
        return f.label if f.label == NO_CROSSOVER else f"{bold} at every {knob}"
    c = f.comparison or {}
    paired = c.get("paired") or {}
    if f.label in (WIN, LOSS, WITHIN_MARGIN) and paired.get("mean") is not None:
        mean = -paired["mean"] if f.flipped else paired["mean"]
        return f"{bold} {difference(mean, paired.get('ci'))}"
    if f.label == EQUIVALENT:
        return f"{bold} ±{number(paired.get('margin'), 2)}"
    if f.label == INCONCLUSIVE and c.get("detectable") is not None:
        return f"{bold} (±{number(c['detectable'], 2)})"
    return bold


def _metric(f: Finding) -> str:
    """``"mse ↓"``: the metric of a finding's task and its better direction."""
    first = f.comparison or next((p for _, p in (f.crossover or {}).get("points", ())), {})
    arrow = "↑" if first.get("higher_is_better") else "↓"
    return f"{first.get('metric', 'metric')} {arrow}"


def _table(found: Sequence[Finding], order: Sequence[str]) -> list[str]:
    """One question's findings as a table: its pairs by rows, its study-task columns."""
    cells: dict[tuple[str, str], dict[Column, list[str]]] = {}
    heads: dict[Column, str] = {}
    for f in found:
        column = (f.study, f.where)
        heads[column] = f"[`{f.study}`]({f.study}.md) {f.where} ({_metric(f)})"
        cells.setdefault((f.first, f.second), {}).setdefault(column, []).append(cell(f))
    columns = sorted(heads, key=lambda c: (order.index(c[0]), natural(c[1])))
    rows = [
        [f"`{first}` − `{second}`", *("; ".join(mine.get(c, ())) for c in columns)]
        for (first, second), mine in sorted(cells.items())
    ]
    return markdown_table(["first − second", *(heads[c] for c in columns)], rows)


def labels_page(reports: Sequence[Mapping[str, Any]]) -> str:
    """The matrix page: a table per question over the studies the finding reads, then the
    studies outside it, each with why."""
    judged = [r for r in reports if in_finding(r)]
    order = [r["name"] for r in judged]
    found = [f for r in judged for f in study_findings(r, untested=True)[0]]
    lines = ["# Labels across studies", "", GENERATED, "", INTRO, ""]
    for asked in QUESTIONS:
        mine = [f for f in found if f.question == asked]
        if mine:
            lines += [f"## {capital(asked)}", "", *_table(mine, order), ""]
    if not found:
        lines += ["No study the finding reads draws a comparison of two rows yet.", ""]
    others = [r for r in reports if not in_finding(r)]
    if others:
        lines += [
            "## Outside the matrix",
            "",
            "Studies the finding does not read; their labels are on their pages.",
            "",
            *(f"- [`{r['name']}`]({r['name']}.md): {outside(r)}." for r in others),
            "",
        ]
    return "\n".join(lines)
