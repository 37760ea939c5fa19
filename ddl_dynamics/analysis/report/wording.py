"""The words a text may use for a comparison: one sentence per label, in one place.

Every sentence that states a comparison's result (in a report, on a study page, in the
README's headline) is made here from the comparison's label (`verdicts`), so that no
text reads an inconclusive test as "no effect" or a difference as larger than its test
says. A comparison is read in the shape the JSON report gives it (a dict: ``task``,
``model``, ``control``, ``label``, ``paired`` with ``mean``, ``ci``, ``total`` and
``margin``, ``detectable``); `as_record` turns a `Comparison`
into that shape. The words of each label are its entry in `labels` (`Label.says`, filled
here); a label the table does not list gets a neutral sentence that names it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..judge.labels import LABELS, NO_DIFFERENCE, entry
from ..judge.labels import MEANINGS as MEANINGS
from ..judge.stats import ALPHA, PAIRED_T
from ..judge.verdicts import MIN_PAIRS

#: Words that state an effect (or its absence) and must never stand beside an inconclusive
#: comparison: not significant is not equal.
EFFECT_WORDS = ("nothing", "only", "no effect", "adds nothing", "changes nothing")
#: The opening of a sentence that describes without a test (curves, "on every seed").
DESCRIPTIVE = "Descriptive, not a test"


def as_record(comparison: Any) -> Mapping[str, Any]:
    """A `Comparison` (or its JSON dict) as the dict this module reads."""
    return comparison if isinstance(comparison, Mapping) else dataclasses.asdict(comparison)


def number(value: float | None, digits: int = 4) -> str:
    """A figure to ``digits`` significant digits, ``"—"`` for none."""
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def metric_title(task: str, metric: str, higher_is_better: bool, floor: float | None) -> str:
    """A task table's title: ``"var-chain[hops=4] (accuracy ↑, floor 0.625)"``, the floor
    being the chance or shortcut level its rows are read against (none where the task
    states none)."""
    said = f"{metric} {'↑' if higher_is_better else '↓'}"
    return f"{task} ({said}" + ("" if floor is None else f", floor {number(floor, 3)}") + ")"


def difference(mean: float | None, ci: float | None) -> str:
    """A paired mean difference, signed, with its CI half-width: ``"-0.41 ± 0.12"``."""
    if mean is None:
        return "—"
    return f"{mean:+.3g}" if ci is None else f"{mean:+.3g} ± {number(ci, 2)}"


def _n(paired: Mapping[str, Any]) -> int:
    """Seeds compared, failures included (as `total` counts them)."""
    return sum(
        len(paired.get(k) or ()) for k in ("seeds", "failed", "control_failed", "both_failed")
    )


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
    span = (
        f"90% interval [{interval[0]:+.3g}, {interval[1]:+.3g}]" if interval else "no 90% interval"
    )
    text += f" ({span}; mean Δ = {difference(paired.get('mean'), None)}, {seeds_text(paired)})"
    if significant(c):
        better = (paired["mean"] > 0) == bool(c.get("higher_is_better"))
        text += (
            f"; yet significantly {'better' if better else 'worse'}, by less than the "
            f"margin (Holm p = {number(c['p_adjusted'], 2)})"
        )
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
    return (
        f"`{c['model']}` against `{control}` on {c['task']} "
        f"({split} {c.get('metric', 'metric')} {arrow}{instead})"
    )


def undetected(comparison: Any) -> str:
    """Why an inconclusive comparison detected no difference, as every text says it: the
    smallest difference its test could have detected, or why it states none (too few
    seeds, identical values, an exact test, which has no such size, and, outside the
    family, the smallest p it can give); empty where none of these holds."""
    c = as_record(comparison)
    paired = c.get("paired") or {}
    test, floor = paired.get("test", PAIRED_T), paired.get("floor") or 0.0
    if c.get("detectable") is not None:
        return f"detectable ±{number(c['detectable'], 2)}"
    if len(paired.get("seeds") or ()) < MIN_PAIRS:
        return "too few seeds for a test"
    if paired.get("differences") and not any(paired["differences"]) and not failures(c):
        return "identical on every seed"  # a shared ceiling, not a test of equality
    if test == PAIRED_T:
        return ""
    if c.get("p_adjusted") is None and floor > 0:  # outside the family (Tarone)
        return (
            f"decided by an exact test ({test}), whose p cannot fall below "
            f"{number(floor, 3)} at this n"
        )
    return f"decided by an exact test ({test}), which has no detectable size"


def failures(comparison: Any) -> list[tuple[str, int]]:
    """Each side that failed seeds, with how many (a seed both failed counts for both)."""
    c = as_record(comparison)
    paired = c.get("paired") or {}
    both = len(paired.get("both_failed") or ())
    return [
        (str(side), len(paired.get(key) or ()) + both)
        for side, key in ((c["model"], "failed"), (c["control"], "control_failed"))
        if paired.get(key) or both
    ]


def _delta(c: Mapping[str, Any]) -> str:
    """``"Δ = +0.4 ± 0.1, n = 8"``."""
    paired = c.get("paired") or {}
    return f"Δ = {difference(paired.get('mean'), paired.get('ci'))}, {seeds_text(paired)}"


def _failed(c: Mapping[str, Any]) -> str:
    """``"`ddl` fails 2/8"``, each side that failed."""
    total = _n(c.get("paired") or {})
    return ", ".join(f"`{side}` fails {k}/{total}" for side, k in failures(c)) or "a row failed"


#: The fields a label's sentence may use (`labels.Label.says`), each made from the record.
_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "label": lambda c: str(c["label"]),
    "delta": _delta,
    "n": lambda c: seeds_text(c.get("paired") or {}),
    "equivalence": equivalence_text,
    "undetected": lambda c: "; ".join(part for part in (undetected(c), _delta(c)) if part),
    "failed": _failed,
}


class _Fields(dict[str, str]):
    """A record's `_FIELDS`, each made when a sentence asks for it."""

    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        self.c = c

    def __missing__(self, name: str) -> str:
        return _FIELDS[name](self.c)


def sentence(comparison: Any) -> str:
    """The one sentence that states a comparison's result, from its label's entry."""
    c = as_record(comparison)
    return f"{subject(c)}: {entry(c['label']).says.format_map(_Fields(c))}."


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
    return [
        line
        for line in text.splitlines()
        if NO_DIFFERENCE in line.lower() and any(_has_word(line.lower(), w) for w in EFFECT_WORDS)
    ]


def _has_word(line: str, word: str) -> bool:
    """Whether ``word`` stands alone in ``line``: not inside a longer word, hyphenated
    compounds (``write-only``) included."""
    start = line.find(word)
    while start >= 0:
        end = start + len(word)
        if (start == 0 or not _in_word(line[start - 1])) and (
            end == len(line) or not _in_word(line[end])
        ):
            return True
        start = line.find(word, start + 1)
    return False


def _in_word(char: str) -> bool:
    return char.isalnum() or char == "-"
