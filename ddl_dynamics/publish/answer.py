"""A study page's opening paragraph: its questions answered from its labels alone.

A study asks its questions in its experiment file (a declared comparison's ``question``);
the labels of the comparisons declared for a question answer it, in one sentence after the
question's own words. Its other findings (all of them, for a study that asks none) answer
the finding's questions (`finding.question`: the erase term, β > 1, each row against its
baseline, …), one sentence each, the Delta row first, as the README's finding reads them.

A sentence says what its labels allow and no more (`clause`): a win or a loss with its
size (the mean difference and its 95% CI), "no difference detected" with the size its test
could have seen (never "no effect" or "equal"), equivalence within the task's margin, and a
comparison no test was drawn for as such (both solved, both at floor, not tested). It says
which row measured better, never why: a premise a question states is not tested by it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.judge.verdicts import EQUIVALENT, INCONCLUSIVE, LABELS, LOSS, WIN
from ..analysis.report.wording import MEANINGS, NO_DIFFERENCE, number, undetected, where
from ..analysis.run import in_tasks
from .finding import (
    NO_CROSSOVER,
    QUESTIONS,
    UNTESTED,
    WITHIN_MARGIN,
    Finding,
    capital,
    crossing,
    identity,
    kind,
    study_findings,
)

#: The order a sentence states its labels in: the rule book's, the finding's own after.
ORDER = (*LABELS, WITHIN_MARGIN, NO_CROSSOVER)
#: Most tasks one clause lists, and most clauses one sentence holds, before "and k more".
TASKS, CLAUSES = 3, 4
#: What the paragraph opens with: what its sentences rest on.
OPENING = "**The answer**, from the labels alone (a label says which row measured better, not why):"


def answering(report: Mapping[str, Any], asked: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The comparisons of a report that answer a declared question: its rows, on its tasks
    (all where it names none) and the split it asked for."""
    return [
        c
        for c in report["comparisons"]
        if c["model"] == asked["model"]
        and c["control"] == asked["control"]
        and in_tasks(c["task"], asked["tasks"])
        and (c.get("asked_split") or c.get("split", "test")) == asked["split"]
    ]


def _size(f: Finding) -> str:
    """``"by 0.21 ± 0.063 mse"``: a decided difference's size, from either side."""
    c = f.comparison or {}
    paired = c.get("paired") or {}
    mean, ci = paired.get("mean"), paired.get("ci")
    if mean is None:
        return ""
    spread = "" if ci is None else f" ± {number(ci, 2)}"
    return f"by {number(abs(mean), 3)}{spread} {c.get('metric', '')}".rstrip()


def _within(f: Finding) -> str:
    """A significant difference inside the margin: its direction from the first row."""
    c = f.comparison or {}
    paired = c.get("paired") or {}
    ahead = (paired.get("mean", 0) > 0) == bool(c.get("higher_is_better"))
    return (
        f"significantly {'better' if ahead != f.flipped else 'worse'} {_size(f)}, inside "
        f"the margin ±{number(paired.get('margin'), 2)}"
    )


def _detail(f: Finding) -> str:
    """What a task's item says in brackets beside it: the size its label allows."""
    c = f.comparison or {}
    if f.label in (WIN, LOSS):
        return _size(f)
    if f.label == WITHIN_MARGIN:
        return _within(f)
    if f.label == EQUIVALENT:
        return f"within ±{number((c.get('paired') or {}).get('margin'), 2)}"
    if f.label == INCONCLUSIVE:
        return undetected(c)
    return ""


def _item(f: Finding) -> str:
    """One task of a clause: ``"parity (by 0.5 ± 0.01 accuracy)"``; a crossover with where
    it crosses, or at every knob value its one label holds."""
    if f.crossover is None:
        return f.where + (f" ({detail})" if (detail := _detail(f)) else "")
    knob = f.crossover["setting"]["knob"]
    if f.label == NO_CROSSOVER:
        return f"{f.where} (over {knob})"
    if f.crossover.get("star") is not None:
        return f.where + crossing(f)
    return f"{f.where} at every {knob} value"


def _tasks(found: Sequence[Finding]) -> str:
    """``"parity (by 0.5 ± 0.01 accuracy), overwrite and 2 more"``."""
    items = [_item(f) for f in found[:TASKS]]
    if len(found) > TASKS:
        items.append(f"{len(found) - TASKS} more")
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def clause(label: str, first: str, second: str, found: Sequence[Finding]) -> str:
    """One pair of rows with one label on the tasks of ``found``, in the words the label
    allows."""
    rows, tasks = f"`{first}` {{}} `{second}`", _tasks(found)
    if label in (WIN, LOSS):
        return rows.format("beats" if label == WIN else "does worse than") + f" on {tasks}"
    if label == EQUIVALENT:
        return rows.format("is equivalent to") + f" on {tasks}"
    if label == INCONCLUSIVE:
        return f"{NO_DIFFERENCE} between `{first}` and `{second}` on {tasks}"
    if label == WITHIN_MARGIN:  # its items say which way and that it is inside the margin
        return rows.format("against") + f" on {tasks}"
    said = MEANINGS[label][1] if label in UNTESTED else label
    return rows.format("against") + f" on {tasks} — {said}"


def clauses(found: Sequence[Finding]) -> list[str]:
    """One clause per label and pair of rows, wins and losses first (the rule book's
    order), at most `CLAUSES` and a last one that counts the rest."""
    rank = {label: i for i, label in enumerate(ORDER)}
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in sorted(found, key=lambda f: rank.get(f.label, len(ORDER))):
        groups.setdefault((f.label, f.first, f.second), []).append(f)
    said = [clause(*key, mine) for key, mine in groups.items()]
    if len(said) <= CLAUSES:
        return said
    rest = sum(len(mine) for mine in list(groups.values())[CLAUSES - 1 :])
    return [*said[: CLAUSES - 1], f"and {rest} more findings (below)"]


def declared(
    report: Mapping[str, Any], asked: Mapping[str, Any], tested: bool = False
) -> tuple[str, list[Any]]:
    """A declared question answered, and the tests that answered it; ``tested``: by the
    comparisons a test was drawn for alone, where any was, after the question's first
    sentence (the front page's short form)."""
    answers = answering(report, asked)
    drawn = [c for c in answers if c["label"] not in UNTESTED]
    if tested and drawn:
        answers = drawn
    found = [
        Finding(
            report["name"],
            asked["question"],
            c["model"],
            str(c["control"]),
            where(c),
            kind(c, False),
            False,
            comparison=c,
        )
        for c in answers
    ]
    words = clauses(found) or ["not drawn: the study's report holds no such comparison"]
    text, question = capital("; ".join(words)), asked["question"].strip()
    if tested:  # the question's first sentence
        question = re.split(r"(?<=\?) ", question, maxsplit=1)[0]
    return f"*{question}* {text}.", [identity(c) for c in answers]


def answer(report: Mapping[str, Any]) -> str:
    """The paragraph a study page opens with: each declared question answered, then each of
    the finding's questions its other comparisons answer; one sentence a line."""
    lines, answered = [OPENING], set()
    for asked in report.get("questions") or ():
        text, tests = declared(report, asked)
        lines.append(text)
        answered |= set(tests)
    found, _ = study_findings(report)
    rest: dict[str, list[Finding]] = {}
    for f in sorted(found, key=lambda f: QUESTIONS.index(f.question)):
        points = (
            [p for _, p in f.crossover["points"]]
            if f.crossover is not None
            else [f.comparison or {}]
        )
        if not any(identity(p) in answered for p in points):
            rest.setdefault(f.question, []).append(f)
    lines += [
        f"{capital(question)}: {'; '.join(clauses(mine))}." for question, mine in rest.items()
    ]
    if len(lines) == 1:
        lines.append("The study draws no comparison of two rows.")
    if not report.get("shipped"):
        lines.append("These are the labels of the rules it was published under (below).")
    return "\n".join(lines)
