"""The label table: a new label is one entry and its rule, and every text, figure and style
sheet shows it; an inconclusive comparison says why in the same words in every text."""

import json

import pytest
from matplotlib.colors import to_rgb
from test_verdict_rules import BASE8, BETTER8, cell, report, row

from ddl_dynamics.analysis.judge import comparisons
from ddl_dynamics.analysis.judge.crossover import crossover_point
from ddl_dynamics.analysis.judge.labels import (
    BETTER,
    INCONCLUSIVE,
    LABELS,
    MARK_COLORS,
    MEANINGS,
    TABLE,
    WIN,
    Label,
    entry,
)
from ddl_dynamics.analysis.judge.verdicts import CONFIRMED, CONTRADICTED, claim_verdict
from ddl_dynamics.analysis.plots.summary import verdict_matrix
from ddl_dynamics.analysis.render.formats import render, render_json
from ddl_dynamics.analysis.render.html import render_html
from ddl_dynamics.analysis.report.text import comparison_cells
from ddl_dynamics.analysis.report.wording import sentence, undetected
from ddl_dynamics.publish.study_page import study_page

#: A throw-away label: a win by more than a quarter of the metric's range.
CLEAR = Label(
    "clear win",
    "a win by more than 0.25",
    "clearly beats, with the difference",
    "clear win, the model is far better ({delta})",
    "#123456",
    text="white",
    ink="#654321",
    shows=BETTER,
    tested=True,
)


@pytest.fixture
def clear_win(monkeypatch):
    """`CLEAR` in the table, and its rule beside the rule book's: a win by more than 0.25."""
    monkeypatch.setitem(TABLE, CLEAR.name, CLEAR)
    rule = comparisons.label

    def label(paired, *args, **kwargs):
        found = rule(paired, *args, **kwargs)
        return CLEAR.name if found == WIN and abs(paired.mean) > 0.25 else found

    monkeypatch.setattr(comparisons, "label", label)


def test_a_new_label_is_one_entry_and_its_rule(clear_win):
    rep = report(row("resnet", BASE8) + row("ddl", BETTER8))
    [c] = rep.comparisons
    assert c.label == CLEAR.name
    said = "clear win, the model is far better (Δ = +0.3 ± 0.0089, n = 8)"
    md = render(rep)  # the summary counts it and states it, the table gives it
    assert "1 comparisons, 1 tests: 1 clear win." in md
    assert f"- `ddl` against `resnet` on parity (test accuracy ↑): {said}." in md
    assert "| clear win (n = 8) |" in md
    page = render_html(rep)  # styled with its ink
    assert '<td class="clear-win">clear win (n = 8)</td>' in page and said in page
    assert ".clear-win { color: #654321; font-weight: 600; }" in page
    study = study_page(json.loads(render_json(rep)), [])  # a study page's sentence
    assert f"- {sentence(c)}" in study and said in study
    fig = verdict_matrix({"parity": {"ddl": (c.label, "+0.3")}})  # its colour, its legend
    [patch] = fig.axes[0].patches
    assert patch.get_facecolor()[:3] == pytest.approx(to_rgb(CLEAR.colour))
    assert [t.get_color() for t in fig.axes[0].texts] == ["white"]
    assert CLEAR.name in [t.get_text() for t in fig.legends[0].get_texts()]
    # the glossary, the claims and the crossover read it too
    assert CLEAR.name in LABELS and MEANINGS[CLEAR.name] == (CLEAR.meaning, CLEAR.words)
    assert MARK_COLORS[CLEAR.name] == CLEAR.colour
    assert claim_verdict(CLEAR.name, "better") == CONFIRMED
    assert claim_verdict(CLEAR.name, "worse") == CONTRADICTED
    assert crossover_point([(0.0, c), (1.0, c)]) == 0.0


def test_a_label_the_table_does_not_list_is_drawn_grey_and_said_neutrally():
    fig = verdict_matrix({"parity": {"ddl": ("a label of the future", "+0.3")}})
    [patch] = fig.axes[0].patches
    assert patch.get_facecolor()[:3] == pytest.approx(to_rgb(entry("x").colour))
    assert "a label of the future" not in LABELS


def _inconclusive(rows):
    [c] = report(rows).comparisons
    assert c.label == INCONCLUSIVE
    return c


NOISY = [v + 0.01 * (-1) ** s for s, v in enumerate(BASE8)]


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        # a failed seed: the signed ranks decide, over differences that vary
        (
            [*row("resnet", BASE8), *row("gated", NOISY[:7]), cell("gated", 7, None, "failed")],
            "decided by an exact test (signed rank, failures last), which has no detectable size",
        ),
        # the same at three pairs: outside the family, its p cannot reach the level
        (
            [*row("resnet", BASE8[:4]), *row("gated", NOISY[:3]), cell("gated", 3, None, "failed")],
            "decided by an exact test (signed rank, failures last), whose p cannot fall "
            "below 0.125 at this n",
        ),
        # identical where both finished, but a seed failed: not identical on every seed
        (
            [*row("resnet", BASE8), *row("gated", BASE8[:7]), cell("gated", 7, None, "failed")],
            "decided by an exact test (signed rank, failures last), whose p cannot fall below 1 at "
            "this n",
        ),
        (row("resnet", BASE8[:4]) + row("gated", BASE8[:4]), "identical on every seed"),
        (row("resnet", BASE8[:2]) + row("gated", NOISY[:2]), "too few seeds for a test"),
        (
            row("resnet", BASE8) + row("gated", [v + 0.3 * (-1) ** s for s, v in enumerate(BASE8)]),
            "detectable ±0.37",
        ),
    ],
)
def test_an_inconclusive_comparison_says_why_in_the_same_words_everywhere(rows, why):
    """The sentence once said "the differences do not vary" beside signed ranks over
    differences that vary, while the report's table said otherwise: one source now."""
    c = _inconclusive(rows)
    head, [cells] = comparison_cells(report(rows))
    verdict = cells[head.index("verdict")]
    assert undetected(c) == why
    assert f"; {why})" in verdict and f"({why}; Δ = " in sentence(c)
    assert "do not vary" not in verdict + sentence(c)
