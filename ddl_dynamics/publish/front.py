"""The front pages: the README's headline block, the headline figure and the study index,
each from the published studies' reports alone (`pages` writes them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._task import TASKS
from ..analysis.figures import draw_headline
from ..analysis.judge.verdicts import EQUIVALENT, INCONCLUSIVE, LOSS, WIN
from ..analysis.report.wording import counts_text
from ..analysis.run import recorded_config
from .answer import declared
from .finding import (
    WITHIN_MARGIN,
    Finding,
    by_question,
    capital,
    findings,
    in_finding,
    outside,
    points,
    question_lines,
    study_findings,
    summary,
)
from .matrix import PAGE as LABELS_PAGE
from .study_page import GENERATED

#: The headline's colour for a significant difference within the margin (Okabe–Ito's
#: reddish purple; the labels' own are those of the verdict matrix).
WITHIN_MARGIN_COLOR = "#CC79A7"
#: Where the headline figure goes, relative to the repository root.
HEADLINE = Path("docs") / "headline.png"


#: The labels of decided findings, in the order a digest names them.
DECIDED = (WIN, LOSS, EQUIVALENT, WITHIN_MARGIN)


def digest(found: Sequence[Finding], limit: int = 2) -> list[str]:
    """One Markdown list item per question: its labels counted, its decided findings named
    (the first ``limit``, wins first), and the open finding whose test could see the
    smallest difference: what the question's evidence shows, and how closely the rest of it
    was looked at."""
    lines = []
    for asked, mine in by_question(found).items():
        decided = sorted(
            (f for f in mine if f.label in DECIDED), key=lambda f: DECIDED.index(f.label)
        )
        parts = [counts_text(Counter(f.label for f in mine))]
        if decided:
            more = f" and {len(decided) - limit} more" if len(decided) > limit else ""
            parts.append("; ".join(f.text for f in decided[:limit]) + more)
        sized = [f for f in mine if f.label == INCONCLUSIVE and _detectable(f) is not None]
        if sized:
            parts.append(
                "the closest look: " + min(sized, key=lambda f: _detectable(f) or 0.0).text
            )
        lines.append(f"- **{asked}**: " + ". ".join(capital(p) for p in parts) + ".")
    return lines


def _detectable(f: Finding) -> float | None:
    return (f.comparison or {}).get("detectable")


# --- the README's headline

#: The study index, from the repository's root.
INDEX = "docs/studies/index.md"


def readme_block(reports: Sequence[Mapping[str, Any]]) -> str:
    """The finding over the tuned studies (`finding`: each distinct test once, by
    question, the Delta row first), the headline figure, the Transformer studies' findings
    in short, question by question (`digest`), and a link to the study index."""
    judged = [r for r in reports if in_finding(r)]
    studies_text = "study" if len(judged) == 1 else "studies"
    found, left = findings(judged)
    lead, *items = summary(found, left, limit=2)  # the front page names two per question
    ships = "the cells it ships" if len(judged) == 1 else "the cells they ship"
    lines = [
        f"**The finding**, over {len(judged)} tuned {studies_text} judged from {ships} "
        "by today's rules: " + lead,
        "",
        *items,
        "",
        f"![Every finding by question: difference in margins, label]({HEADLINE})",
        "",
        "One line per pair of rows (the Delta row first), a dot per task or knob value: "
        "the paired mean difference in units of the task's margin (or of the test's "
        "detectable difference), right where the first row is better; the band is the "
        "margin, the colour the label.",
        "",
    ]
    transformers = [r for r in judged if of_transformers(r)]
    if transformers:
        plural = "study" if len(transformers) == 1 else "studies"
        lines += [
            f"In the Transformer ({len(transformers)} {plural}), question by question: the "
            "labels counted, the decided findings named, and the open finding whose test could "
            "see the smallest difference:",
            "",
            *digest(findings(transformers)[0]),
            "",
        ]
    lines.append(
        f"Every study with the labels of its findings and its own questions answered: "
        f"[the studies]({INDEX})."
    )
    return "\n".join(lines)


def of_transformers(report: Mapping[str, Any]) -> bool:
    """Whether a study trains Transformers: every task its experiment runs is a sequence
    task (a task the registry does not hold, one of a task file, counts as not)."""
    try:
        names = [t["name"] for t in recorded_config(report["experiment"]["config"])["tasks"]]
    except (KeyError, TypeError):
        return False
    return bool(names) and all(
        n in TASKS and getattr(TASKS.get(n), "kind", "") == "sequence" for n in names
    )


def counts_of(report: Mapping[str, Any]) -> Counter[str]:
    """How many of a study's distinct findings carry each label."""
    return Counter(f.label for f in study_findings(report)[0])


# --- the headline figure


def headline_figure(reports: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Every finding by question, each a difference in margins and a label per task
    (`points`), drawn by `draw_headline` (left unchanged where the data it draws have not)."""
    panels: dict[str, dict[str, list[tuple[float, str]]]] = {}
    for f in findings(reports)[0]:
        if drawn := points(f):
            panels.setdefault(f.question, {}).setdefault(f"{f.first} − {f.second}", []).extend(
                drawn
            )
    return draw_headline(panels, path, {WITHIN_MARGIN: WITHIN_MARGIN_COLOR})


# --- the study pages


def index_page(reports: Sequence[Mapping[str, Any]]) -> str:
    """Every study with the labels of its distinct findings, the questions the studies ask
    answered in short, then the finding's counts by question."""
    found, _ = findings([r for r in reports if in_finding(r)])
    lines = [
        "# Studies",
        "",
        GENERATED,
        "",
        "Every study whose results ship in `results/`, with the labels of its distinct "
        "findings (each test once, a crossover once); the [labels across studies]"
        f"({LABELS_PAGE}) set the findings of those the README's finding reads side by "
        "side.",
        "",
    ]
    lines += [
        f"- [`{r['name']}`]({r['name']}.md): {counts_text(counts_of(r)) or 'no finding'}"
        + (f" ({why}; not part of the finding)." if (why := outside(r)) else ".")
        for r in reports
    ]
    asked = [
        f"- [`{r['name']}`]({r['name']}.md): "
        + " ".join(declared(r, q, tested=True)[0] for q in r["questions"])
        for r in reports
        if r.get("questions")
    ]
    if asked:
        lines += ["", "The studies' own questions, answered by their labels alone:", "", *asked]
    if found:
        lines += ["", "The README's finding by question:", "", *question_lines(found)]
    return "\n".join(lines) + "\n"
