"""The words a text may use for a comparison: one sentence per label, in one place.

Every sentence that states a comparison's result (in a report, on a study page, in the
README's headline) is made here from the comparison's label (`verdicts`), so that no
text reads an inconclusive test as "no effect" or a difference as larger than its test
says. A comparison is read in the shape the JSON report gives it (a dict: ``task``,
``model``, ``control``, ``label``, ``paired`` with ``mean``, ``ci``, ``total`` and
``margin``, ``detectable``); `as_record` turns a `Comparison`
into that shape. A label this module does not know gets a neutral sentence that names it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .stats import ALPHA, PAIRED_T
from .verdicts import (
    AT_FLOOR,
    BOTH_SOLVED,
    EQUIVALENT,
    FAILS,
    INCONCLUSIVE,
    LABELS,
    LOSS,
    MIN_PAIRS,
    UNEQUAL_BUDGET,
    UNEQUAL_TUNING,
    UNMATCHED_SIZE,
    WIN,
)

#: Words that state an effect (or its absence) and must never stand beside an inconclusive
#: comparison: not significant is not equal.
EFFECT_WORDS = ("nothing", "only", "no effect", "adds nothing", "changes nothing")
#: The phrase every inconclusive sentence uses (and what `effect_words` looks beside).
NO_DIFFERENCE = "no difference detected"
#: The opening of a sentence that describes without a test (curves, "on every seed").
DESCRIPTIVE = "Descriptive, not a test"

#: What each label means and the words a text may use for it: the rule book's glossary.
MEANINGS: dict[str, tuple[str, str]] = {
    WIN: ("the model is better than the control: Holm-adjusted p below the level, in the "
          "metric's better direction", "beats, with the difference and its 95% CI"),
    LOSS: ("the model is worse than the control: Holm-adjusted p below the level, in the "
           "metric's worse direction", "does worse than, with the difference and its 95% CI"),
    EQUIVALENT: ("the difference lies within the task's margin: the Holm-adjusted TOST p "
                 "is below the level", "equivalent within ±margin"),
    INCONCLUSIVE: ("neither a difference nor equivalence is shown, or fewer seeds than a "
                   "test needs; not significant is never equal",
                   f"{NO_DIFFERENCE} (detectable ±x), and no word of effect"),
    BOTH_SOLVED: ("both rows reached the metric's best value on every seed: a ceiling, kept "
                  "out of the adjusted family; no test can tell them apart there",
                  "both solved (a ceiling, no test)"),
    AT_FLOOR: ("both rows at the task's chance or shortcut level (its floor): no test is "
               "drawn, outside the adjusted family, and no claim is confirmed or contradicted",
               "both at floor (no test)"),
    FAILS: ("fewer than 3 seeds finished on both sides because a row failed: the failures "
            "are the result", "fails k/n, naming the row that failed"),
    UNEQUAL_TUNING: ("the two rows searched different grids (or only one searched): a tuned "
                     "row carries a winner's curse against a fixed one, so no test is drawn",
                     "not tested: the tuning differs"),
    UNEQUAL_BUDGET: ("the two rows trained on different budgets: no test is drawn",
                     "not tested: the budgets differ"),
    UNMATCHED_SIZE: ("the two rows' parameter counts are too far apart: no test is drawn",
                     "not tested: the sizes differ"),
}


def as_record(comparison: Any) -> Mapping[str, Any]:
    """A `Comparison` (or its JSON dict) as the dict this module reads."""
    return comparison if isinstance(comparison, Mapping) else dataclasses.asdict(comparison)


def number(value: float | None, digits: int = 4) -> str:
    """A figure to ``digits`` significant digits, ``"—"`` for none."""
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def difference(mean: float | None, ci: float | None) -> str:
    """A paired mean difference, signed, with its CI half-width: ``"-0.41 ± 0.12"``."""
    if mean is None:
        return "—"
    return f"{mean:+.3g}" if ci is None else f"{mean:+.3g} ± {number(ci, 2)}"


def _n(paired: Mapping[str, Any]) -> int:
    """Seeds compared, failures included (as `total` counts them)."""
    return sum(len(paired.get(k) or ()) for k in ("seeds", "failed", "control_failed",
                                                    "both_failed"))


def seeds_text(paired: Mapping[str, Any]) -> str:
    """``"n = 8"``, or ``"n = 6 of 8"`` where fewer pairs finished than seeds ran: the n
    the difference is over, beside the n the study ran."""
    finished, total = len(paired.get("seeds") or ()), _n(paired)
    return f"n = {total}" if finished == total else f"n = {finished} of {total}"


def _means(paired: Mapping[str, Any]) -> list[float]:
    """Each side's mean over the finished pairs (none where no pair finished)."""
    done = [(m, c) for _, m, c in paired.get("pairs") or () if m is not None and c is not None]
    return [sum(side) / len(side) for side in zip(*done, strict=True)] if done else []


def significant(c: Mapping[str, Any]) -> bool:
    """Whether the difference test rejected (Holm-adjusted p below the level) on a nonzero
    difference: an "equivalent" that is also significant is no equality."""
    p, mean = c.get("p_adjusted"), (c.get("paired") or {}).get("mean")
    return p is not None and p < ALPHA and bool(mean)


def equivalence_text(c: Mapping[str, Any]) -> str:
    """``"equivalent within ±0.01 (90% interval [-0.004, +0.006]; …)"``: the margin with the
    TOST's 90% interval it was judged by (not the 95% CI). A margin as large as a side's
    mean can only be the task's absolute floor (a relative margin is a fraction of the
    mean), and is said so with its size in means; a significant difference within the
    margin is said beside it."""
    paired = c.get("paired") or {}
    margin = paired.get("margin")
    text = f"equivalent within ±{number(margin, 2)}"
    means = [abs(m) for m in _means(paired) if m]
    if margin is not None and means and margin >= min(means):
        low, high = f"{margin / max(means):.2g}", f"{margin / min(means):.2g}"
        times = f"{low}×" if low == high else f"{low}–{high}×"
        text = f"equivalent within the absolute floor ±{number(margin, 2)} = {times} the means"
    interval = paired.get("interval")
    span = (f"90% interval [{interval[0]:+.3g}, {interval[1]:+.3g}]" if interval
            else "no 90% interval")
    text += f" ({span}; mean Δ = {difference(paired.get('mean'), None)}, {seeds_text(paired)})"
    if significant(c):
        better = (paired["mean"] > 0) == bool(c.get("higher_is_better"))
        text += (f"; yet significantly {'better' if better else 'worse'}, by less than the "
                 f"margin (Holm p = {number(c['p_adjusted'], 2)})")
    return text


def where(c: Mapping[str, Any]) -> str:
    """The task, with the split where it is not test: ``"parity (long)"``, or
    ``"parity (long, judged on test)"`` where the split asked for could not be judged."""
    split, asked = c.get("split", "test"), c.get("asked_split") or ""
    if asked and asked != split:
        return f"{c['task']} ({asked}, judged on {split})"
    return c["task"] if split == "test" else f"{c['task']} ({split})"


def subject(c: Mapping[str, Any]) -> str:
    """``"`ddl` against `resnet` on overwrite (test mse ↓)"``."""
    control = c["control"] if isinstance(c["control"], str) else number(c["control"])
    arrow = "↑" if c.get("higher_is_better") else "↓"
    split, asked = c.get("split", "test"), c.get("asked_split") or ""
    instead = f", in place of {asked}" if asked and asked != split else ""
    return (f"`{c['model']}` against `{control}` on {c['task']} "
            f"({split} {c.get('metric', 'metric')} {arrow}{instead})")


def sentence(comparison: Any) -> str:
    """The one sentence that states a comparison's result, from its label."""
    c = as_record(comparison)
    paired = c.get("paired") or {}
    label = c["label"]
    delta = f"Δ = {difference(paired.get('mean'), paired.get('ci'))}, {seeds_text(paired)}"
    if label == WIN:
        return f"{subject(c)}: {WIN}, the model is better ({delta})."
    if label == LOSS:
        return f"{subject(c)}: {LOSS}, the model is worse ({delta})."
    if label == EQUIVALENT:
        return f"{subject(c)}: {equivalence_text(c)}."
    if label == INCONCLUSIVE:
        if c.get("detectable") is not None:
            seen = f"detectable ±{number(c['detectable'], 2)}"
        elif len(paired.get("seeds") or ()) < MIN_PAIRS:
            seen = "too few seeds for a test"
        elif paired.get("differences") and not any(paired["differences"]):
            seen = "identical on every seed"  # a shared ceiling, not a test of equality
        elif paired.get("test", PAIRED_T) != PAIRED_T:
            seen = f"decided by an exact test ({paired['test']}), which has no detectable size"
        else:
            seen = "no detectable size: the differences do not vary"
        return f"{subject(c)}: {NO_DIFFERENCE} ({seen}; {delta})."
    if label == BOTH_SOLVED:
        return (f"{subject(c)}: {BOTH_SOLVED}, both rows at the metric's best value on every "
                f"seed (a ceiling, no test; {seeds_text(paired)}).")
    if label == AT_FLOOR:
        return (f"{subject(c)}: {AT_FLOOR}, both rows at the task's chance or shortcut level "
                f"(no test; {seeds_text(paired)}).")
    if label == FAILS:
        failed = {side: len(paired.get(key) or ()) + len(paired.get("both_failed") or ())
                  for side, key in ((c["model"], "failed"), (c["control"], "control_failed"))}
        sides = ", ".join(f"`{side}` {FAILS} {k}/{_n(paired)}"
                          for side, k in failed.items() if k) or "a row failed"
        return f"{subject(c)}: {sides}; too few finished pairs for a test."
    if label == UNEQUAL_TUNING:
        return f"{subject(c)}: not tested, the tuning differs."
    if label == UNEQUAL_BUDGET:
        return f"{subject(c)}: not tested, the budgets differ."
    if label == UNMATCHED_SIZE:
        return f"{subject(c)}: not tested, the sizes differ."
    return f"{subject(c)}: labelled \"{label}\" by the rule book ({delta})."


def descriptive(text: str) -> str:
    """A statement read off curves or seeds rather than a test, said to be one."""
    return f"{DESCRIPTIVE}: {text}"


def counts(comparisons: Iterable[Any]) -> Counter[str]:
    """How many comparisons carry each label."""
    return Counter(as_record(c)["label"] for c in comparisons)


def counts_text(found: Mapping[str, int]) -> str:
    """``"2 win, 1 loss, 5 inconclusive"``: every label present, in the rule book's order
    (labels it does not list after, by name)."""
    order = [*LABELS, *sorted(set(found) - set(LABELS))]
    return ", ".join(f"{found[label]} {label}" for label in order if found.get(label))


def effect_words(text: str) -> list[str]:
    """The lines of ``text`` that put an effect word beside an inconclusive comparison."""
    return [line for line in text.splitlines() if NO_DIFFERENCE in line.lower()
            and any(_has_word(line.lower(), w) for w in EFFECT_WORDS)]


def _has_word(line: str, word: str) -> bool:
    start = line.find(word)
    while start >= 0:
        end = start + len(word)
        if (start == 0 or not line[start - 1].isalnum()) and (
                end == len(line) or not line[end].isalnum()):
            return True
        start = line.find(word, start + 1)
    return False
