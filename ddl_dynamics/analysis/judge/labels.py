"""The verdict labels, one entry each, so that a label is said, drawn and styled alike
everywhere.

Each entry (`Label`) holds what a label means, the words a text may use for it, the
sentence that states it, its colours in the figures and the HTML report, and what it
decides. The sentences (`report.wording`), the report's cells (`report.text`), the verdict
figures (`plots.summary`), the HTML style sheet (`render.html`), the claims
(`verdicts.claim_verdict`) and the crossover (`crossover`) read a label here and nowhere else,
so a new label is one entry in `TABLE` and its rule in the rule book (`verdicts`: `GATES` or
`label`). `LABELS`, `MEANINGS` and `MARK_COLORS` are views of the table that follow it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from typing import TypeVar

WIN, LOSS, EQUIVALENT, INCONCLUSIVE = "win", "loss", "equivalent", "inconclusive"
#: Both rows at the metric's best value on every seed: no test, outside the family.
BOTH_SOLVED = "both solved"
#: Both rows at or below the task's chance or shortcut level (`Task.floor`) on every
#: seed: neither does the task, so no test, outside the family.
AT_FLOOR = "both at floor"
#: Fewer than `verdicts.MIN_PAIRS` seeds both finished because a side failed: "fails k/n".
FAILS = "fails"
UNEQUAL_BUDGET, UNMATCHED_SIZE = "unequal budget", "unmatched size"
#: The two rows searched different grids (or only one searched): no test.
UNEQUAL_TUNING = "unequal tuning"
#: The phrase every inconclusive sentence uses (and what `wording.effect_words` looks
#: beside).
NO_DIFFERENCE = "no difference detected"
#: What a decided label shows of the model against the control (`Label.shows`).
BETTER, WORSE, EQUAL = "better", "worse", "equal"


@dataclass(frozen=True)
class Label:
    """One verdict label.

    ``says`` is the label's sentence after its subject (`wording.sentence`), a template
    whose fields `wording` fills: ``{label}``, ``{delta}`` (the difference, its CI and
    n), ``{n}`` (the seeds), ``{equivalence}`` (the margin and the 90% interval),
    ``{undetected}`` (what an inconclusive test could not see, then the difference) and
    ``{failed}`` (each side that failed, k/n). ``shows`` is what the label decides about
    the model: `BETTER`, `WORSE`, `EQUAL` (within the task's margin) or nothing;
    ``tested``: drawn from the paired test, in the report's adjusted family; ``gate``: no
    test, the rows cannot be compared (hatched in figures). ``colour`` fills its cell in
    the verdict figures, ``text`` is the colour written on it, and ``ink`` its text colour
    in the HTML report (none: plain).
    """

    name: str
    meaning: str
    words: str
    says: str
    colour: str
    text: str = "black"
    ink: str = ""
    shows: str = ""
    tested: bool = False
    gate: bool = False


#: Every label, in the rule book's order (the order of counts and legends).
TABLE: dict[str, Label] = {
    label.name: label
    for label in (
        Label(
            WIN,
            "the model is better than the control: Holm-adjusted p below the level, in the "
            "metric's better direction",
            "beats, with the difference and its 95% CI",
            "win, the model is better ({delta})",
            "#009E73",
            "white",
            "#00734d",
            BETTER,
            tested=True,
        ),
        Label(
            LOSS,
            "the model is worse than the control: Holm-adjusted p below the level, in the "
            "metric's worse direction",
            "does worse than, with the difference and its 95% CI",
            "loss, the model is worse ({delta})",
            "#D55E00",
            "white",
            "#b03000",
            WORSE,
            tested=True,
        ),
        Label(
            EQUIVALENT,
            "the difference lies within the task's margin: the Holm-adjusted TOST p "
            "is below the level",
            "equivalent within ±margin",
            "{equivalence}",
            "#0072B2",
            "white",
            "#005a91",
            EQUAL,
            tested=True,
        ),
        Label(
            INCONCLUSIVE,
            "neither a difference nor equivalence is shown, or fewer seeds than a "
            "test needs; not significant is never equal",
            f"{NO_DIFFERENCE} (detectable ±x), and no word of effect",
            NO_DIFFERENCE + " ({undetected})",
            "#DDDDDD",
            ink="#7a5a00",
            tested=True,
        ),
        Label(
            BOTH_SOLVED,
            "both rows reached the metric's best value on every seed: a ceiling, "
            "kept out of the adjusted family; no test can tell them apart there",
            "both solved (a ceiling, no test)",
            "both solved, both rows at the metric's best "
            "value on every seed (a ceiling, no test; {n})",
            "#56B4E9",
            ink="#555",
        ),
        Label(
            AT_FLOOR,
            "both rows at the task's chance or shortcut level (its floor): no test is "
            "drawn, outside the adjusted family, and no claim is confirmed or contradicted",
            "both at floor (no test)",
            "both at floor, both rows at the task's chance or shortcut level (no test; {n})",
            "#CC79A7",
            ink="#555",
        ),
        Label(
            FAILS,
            "fewer than 3 seeds finished on both sides because a row failed: the "
            "failures are the result",
            "fails k/n, naming the row that failed",
            "{failed}; too few finished pairs for a test",
            "#E69F00",
        ),
        Label(
            UNEQUAL_TUNING,
            "the two rows searched different grids (or only one searched): a "
            "tuned row carries a winner's curse against a fixed one, so no test is drawn",
            "not tested: the tuning differs",
            "not tested, the tuning differs",
            "#FFFFFF",
            gate=True,
        ),
        Label(
            UNEQUAL_BUDGET,
            "the two rows trained on different budgets: no test is drawn",
            "not tested: the budgets differ",
            "not tested, the budgets differ",
            "#FFFFFF",
            gate=True,
        ),
        Label(
            UNMATCHED_SIZE,
            "the two rows' parameter counts are too far apart: no test is drawn",
            "not tested: the sizes differ",
            "not tested, the sizes differ",
            "#FFFFFF",
            gate=True,
        ),
    )
}


def entry(name: str) -> Label:
    """A label's entry; a label the table does not list gets a neutral one that names it
    (a grey cell, a sentence that says the rule book gave it) rather than an error."""
    return TABLE.get(name) or Label(
        name,
        "see the rule book",
        "its name",
        'labelled "{label}" by the rule book ({delta})',
        "#BBBBBB",
    )


T = TypeVar("T")


class _Field(Mapping[str, T]):
    """One field of every label, by name in the table's order: a view that follows
    `TABLE`, so a label added to it shows here too."""

    def __init__(self, read: Callable[[Label], T]) -> None:
        self._read = read

    def __getitem__(self, name: str) -> T:
        return self._read(TABLE[name])

    def __iter__(self) -> Iterator[str]:
        return iter(TABLE)

    def __len__(self) -> int:
        return len(TABLE)


#: Every label a comparison can carry, in the rule book's order.
LABELS: KeysView[str] = TABLE.keys()
#: What each label means and the words a text may use for it: the rule book's glossary.
MEANINGS: Mapping[str, tuple[str, str]] = _Field(lambda label: (label.meaning, label.words))
#: Cell colour of each label in the verdict figures (Okabe–Ito green, vermillion, blue,
#: sky blue, reddish purple and orange; white and hatched where no test was drawn).
MARK_COLORS: Mapping[str, str] = _Field(lambda label: label.colour)
