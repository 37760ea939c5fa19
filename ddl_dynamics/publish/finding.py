"""The finding: what the published studies show, each distinct test once, by the question it
answers.

A study's report can hold one test several times: two task labels that sample the same data
(``switched[event=overwrite,p=0]`` and ``switched[event=reflect,p=0]``), or a comparison
asked on another split and judged on the trained one, as a declared one already is. Two
comparisons with the same rows and the same per-seed values of both sides are one
`Finding` here. A comparison followed over a swept knob (``report["crossovers"]``) is
one finding too, stated with its crossover and interval, not one per knob value. Comparisons
where no test could tell the rows apart (both solved, both at the task's floor) and checks of
an implementation (the same model computed another way) are outside the counts.

Each finding is stated with the Delta row first (``ddl`` beats ``hc``, never a loss for
``hc``) and grouped by the question it answers, by the rows' names (`question`). A study's
own question text (its experiment file's ``question``) stays on its page, above the labels
that answer it: it may state a premise (a mechanism) that no label tests, so the finding
never words a group by it.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..analysis.judge.verdicts import (
    AT_FLOOR,
    BOTH_SOLVED,
    EQUIVALENT,
    INCONCLUSIVE,
    LOSS,
    UNEQUAL_BUDGET,
    UNEQUAL_TUNING,
    UNMATCHED_SIZE,
    WIN,
)
from ..analysis.report.wording import NO_DIFFERENCE, counts_text, number, significant, where

ERASE, BETA, STATE, COMPUTE, PEERS, DEPTH, BASELINE, OTHER = (
    "the erase term",
    "β > 1",
    "the expanded state and EC",
    "a larger baseline",
    "peers",
    "depth and continuous time",
    "each row against its baseline",
    "other comparisons",
)
#: The questions in the order the finding states them.
QUESTIONS = (ERASE, BETA, STATE, COMPUTE, PEERS, DEPTH, BASELINE, OTHER)
#: Labels no test was drawn for: both rows sit at an end of the metric, or the rows are not
#: comparable (their sizes, budgets or tuning differ), so they find nothing either way.
UNTESTED = (BOTH_SOLVED, AT_FLOOR, UNMATCHED_SIZE, UNEQUAL_BUDGET, UNEQUAL_TUNING)
#: A comparison followed over a knob whose labels differ but never settle on a win from
#: some value on: not a test label.
NO_CROSSOVER = "no crossover in range"
#: An equivalent comparison whose difference test also rejected: a difference, smaller
#: than the margin, so never listed as equivalent.
WITHIN_MARGIN = "significant within the margin"
#: Why a comparison is left out of the finding besides its label (`UNTESTED`): it checks an
#: implementation, or repeats a test already counted; with their plurals.
CHECK, REPEAT = "implementation check", "repeat of a counted test"
PLURAL = {CHECK: "implementation checks", REPEAT: "repeats of a counted test"}
#: Name parts that compute the same model another way: a comparison of two rows whose names
#: differ only by one of them checks an implementation, not a question.
SAME_MODEL = ("vmap", "folded", "unfolded")
#: Update rules DDL is weighed against, and the depth and continuous-time rows.
PEER_ROWS, DEPTH_ROWS = ("ddl-product", "ddl-decoupled", "hc", "mhc"), ("node", "anode", "gated")


def capital(text: str) -> str:
    """A question or sentence with its first letter capital where it is a Latin one (a
    question that opens with β keeps it)."""
    return text[:1].upper() + text[1:] if text[:1].isascii() else text


def is_delta(name: str) -> bool:
    """Whether a row is a Delta stack (its name says ``ddl``)."""
    return name.startswith("ddl")


def _bare(name: str) -> str:
    """A row's family as the question table reads it: without ``-tied`` and a trailing
    ``-dv<n>`` (the same rule tied, or at a state width)."""
    return re.sub(r"-dv\d+$", "", name.removesuffix("-tied").replace("-tied-", "-"))


def _same_model(a: str, b: str) -> bool:
    def bare(name: str) -> str:
        return "-".join(p for p in name.split("-") if p not in SAME_MODEL)

    return a != b and bare(a) == bare(b)


def question(model: str, control: str, baseline: bool = False) -> str | None:
    """The question a comparison of two rows answers, from their names; None for a check of
    an implementation. The table, first match wins (a question the two rows' names ask comes
    before their being a row and its baseline: a study whose baseline is a twin asks the twin's
    question):

    - two rows that differ only by a `SAME_MODEL` part: a check, outside the finding;
    - ``ddl*`` against its write-only twin ``ddl-write*`` or additive twin ``additive*``:
      `ERASE`;
    - a row against its ``-bmax1`` twin (β ≤ 1): `BETA`;
    - a row against a ``-w<n>`` row (a baseline made wider: more parameters and compute):
      `COMPUTE`;
    - a ``dv4`` row against a ``-dv1`` row, a ``-repeat`` row or ``transformer-ec``, and
      ``transformer-ec`` against anything: `STATE`;
    - a row against its baseline (``baseline``): `BASELINE`;
    - a peer (`PEER_ROWS`, tied or not, at any ``-dv<n>``) against ``ddl`` or another peer:
      `PEERS`;
    - any comparison with ``node``, ``anode`` or ``gated``: `DEPTH`;
    - anything else: `OTHER`.
    """
    if _same_model(model, control):
        return None
    for a, b in ((model, control), (control, model)):
        if (
            is_delta(a)
            and not a.startswith("ddl-write")
            and b in (a.replace("ddl", "ddl-write", 1), a.replace("ddl", "additive", 1))
        ):
            return ERASE
        if b.replace("-bmax1", "") == a and "bmax1" in b:
            return BETA
        if re.search(r"-w\d+$", b):
            return COMPUTE
        if "transformer-ec" in (a, b) or (
            "dv4" in a and (b.endswith("-dv1") or b.endswith("-repeat"))
        ):
            return STATE
    if baseline:
        return BASELINE
    sides = {_bare(model), _bare(control)}
    if sides & set(PEER_ROWS) and sides <= {*PEER_ROWS, "ddl"}:
        return PEERS
    if sides & set(DEPTH_ROWS):
        return DEPTH
    return OTHER


@dataclasses.dataclass(frozen=True)
class Finding:
    """One distinct test (or one crossover) of a study, read from the Delta row's side.

    ``first`` is the Delta row where only one side is one (else the report's model) and
    ``label`` is read from its side (a loss of ``hc`` against ``ddl`` is a win of ``ddl``);
    ``comparison`` is the report's comparison (for a crossover, None and ``crossover``)."""

    study: str
    question: str
    first: str
    second: str
    where: str
    label: str
    flipped: bool
    comparison: Mapping[str, Any] | None = None
    crossover: Mapping[str, Any] | None = None

    @property
    def text(self) -> str:
        """The finding in words, its first row first: ``"`ddl` beats `hc` on parity"``."""
        pair = f"`{self.first}` {{}} `{self.second}` on {self.where} ({self.study})"
        if self.crossover is not None:
            return pair.format(
                {WIN: "beats", LOSS: "does worse than"}.get(self.label, "against")
            ) + crossing(self)
        if self.label == WIN:
            return pair.format("beats")
        if self.label == LOSS:
            return pair.format("does worse than")
        paired = (self.comparison or {}).get("paired") or {}
        margin = f"±{number(paired.get('margin'), 2)}"
        if self.label == EQUIVALENT:
            return pair.format("is equivalent to") + f" within {margin}"
        if self.label == WITHIN_MARGIN:
            ahead = (paired.get("mean", 0) > 0) == bool(
                (self.comparison or {}).get("higher_is_better")
            )
            better = ahead != self.flipped
            return (
                pair.format("beats" if better else "does worse than")
                + f", by less than the margin {margin}"
            )
        detectable = (self.comparison or {}).get("detectable")
        seen = f" (detectable ±{number(detectable, 2)})" if detectable is not None else ""
        return pair.format("against") + f": {self.label}{seen}"


def in_margins(c: Mapping[str, Any], flipped: bool = False) -> float | None:
    """A comparison's paired difference in units of its margin (of its detectable difference
    where it states none), positive where its first row (the model, or the control where
    ``flipped``) is better; None where it has neither or no difference."""
    paired = c.get("paired") or {}
    unit, mean = paired.get("margin") or c.get("detectable"), paired.get("mean")
    if not unit or mean is None:
        return None
    return mean / unit * (1 if c.get("higher_is_better") else -1) * (-1 if flipped else 1)


def points(f: Finding) -> list[tuple[float, str]]:
    """What a finding draws: its difference in margins with its label, or, for a crossover,
    one per knob value where a test was drawn."""
    tested = (
        [f.comparison]
        if f.comparison is not None
        else [p for _, p in (f.crossover or {}).get("points", ()) if p["label"] not in UNTESTED]
    )
    return [(x, kind(c, f.flipped)) for c in tested if (x := in_margins(c, f.flipped)) is not None]


def crossing(f: Finding) -> str:
    """How a crossover finding crosses: ``" from p* = 0.3 on (95% interval [0.1, none])"``,
    or ``": no crossover in range of p"``; its label at every knob value where it has one."""
    c = f.crossover or {}
    knob = c["setting"]["knob"]
    if f.label == NO_CROSSOVER:
        return f": {NO_CROSSOVER} of {knob}"
    if c.get("star") is None:
        return f": {f.label} at every {knob} tested"
    low, high = c.get("interval") or (None, None)
    bound = lambda v: "none" if v is None else f"{v:g}"  # noqa: E731
    return f" from {knob}* = {c['star']:g} on (95% interval [{bound(low)}, {bound(high)}])"


def _flip(label: str) -> str:
    return {WIN: LOSS, LOSS: WIN}.get(label, label)


def _orient(model: str, control: str) -> tuple[str, str, bool]:
    """The two rows with the Delta row first, and whether that swapped them."""
    swap = not is_delta(model) and is_delta(control)
    return (control, model, True) if swap else (model, control, False)


def _baselines(report: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """Every (task, row, its baseline) the report names: in its tables, or as a comparison
    drawn as a baseline one."""
    return {
        (t["task"], r["model"], r["baseline"])
        for t in report.get("tables", [])
        for r in t["rows"]
        if r.get("baseline")
    } | {
        (c["task"], c["model"], c["control"])
        for c in report.get("comparisons", [])
        if "baseline" in c.get("kinds", ())
    }


def kind(c: Mapping[str, Any], flipped: bool) -> str:
    """A comparison's label from its first row's side (the control's where ``flipped``); an
    equivalence whose difference test also rejected is `WITHIN_MARGIN`."""
    if c["label"] == EQUIVALENT and significant(c):
        return WITHIN_MARGIN
    return _flip(c["label"]) if flipped else c["label"]


def identity(c: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two comparisons one test: the rows (either order) and the per-seed values
    of both sides; a comparison without them is its own test."""
    pairs = (c.get("paired") or {}).get("pairs")
    if not pairs:
        return c["task"], c["model"], c["control"], c.get("split")
    model, control, flipped = _orient(c["model"], c["control"])
    seeds = tuple((s, *((b, a) if flipped else (a, b))) for s, a, b in pairs)
    return model, control, c.get("metric"), seeds


def _crossover_label(x: Mapping[str, Any], labels: set[str], flipped: bool) -> str:
    """A crossover's label from its first row's side, given its points' tested ``labels``:
    a win from a crossover on, else the one label every point has, else `NO_CROSSOVER`."""
    if x.get("star") is not None:
        return LOSS if flipped else WIN
    if len(labels) == 1:
        return _flip(next(iter(labels))) if flipped else next(iter(labels))
    return NO_CROSSOVER


def _crossover_findings(
    report: Mapping[str, Any],
    baselines: set[tuple[str, str, str]],
    untested: bool,
    left: Counter[str],
) -> tuple[list[Finding], set[tuple[str, str, str, str]]]:
    """Each crossover of a study as one finding (counting in ``left`` those left out), and
    the comparisons it followed, which are not findings of their own."""
    name = report.get("name", "")
    out: list[Finding] = []
    crossed: set[tuple[str, str, str, str]] = set()
    for x in report.get("crossovers") or ():
        points = [p for _, p in x["points"]]
        crossed |= {(p["task"], p["model"], p["control"], p.get("split", "test")) for p in points}
        asked = question(
            x["model"],
            x["control"],
            any((p["task"], p["model"], p["control"]) in baselines for p in points),
        )
        if asked is None:
            left[CHECK] += 1
            continue
        first, second, flipped = _orient(x["model"], x["control"])
        labels = {p["label"] for p in points if p["label"] not in UNTESTED}
        if not labels and not untested:
            left[points[0]["label"]] += 1
            continue
        label = _crossover_label(x, labels, flipped) if labels else points[0]["label"]
        family, setting = x["setting"]["family"], x["setting"].get("label")
        out.append(
            Finding(
                name,
                asked,
                first,
                second,
                f"{family}[{setting}]" if setting else family,
                label,
                flipped,
                crossover=x,
            )
        )
    return out, crossed


def study_findings(
    report: Mapping[str, Any],
    untested: bool = False,
) -> tuple[list[Finding], Counter[str]]:
    """A study's findings, and how many comparisons were left out and why (``"both solved"``,
    `CHECK`, `REPEAT`); with ``untested``, a comparison no test was drawn for (`UNTESTED`)
    is a finding with its label rather than left out (a page says it, the counts do not)."""
    name = report.get("name", "")
    baselines = _baselines(report)
    left: Counter[str] = Counter()
    out, crossed = _crossover_findings(report, baselines, untested, left)
    seen: set[tuple[Any, ...]] = set()
    for c in report.get("comparisons", []):
        if (c["task"], c["model"], c["control"], c.get("split", "test")) in crossed:
            continue
        if not isinstance(c["control"], str):
            continue  # against a bound: an expectation, not a comparison of two rows
        asked = question(
            c["model"], c["control"], (c["task"], c["model"], c["control"]) in baselines
        )
        test = identity(c)
        dropped = c["label"] in UNTESTED and not untested
        if asked is None or dropped or test in seen:
            left[CHECK if asked is None else c["label"] if dropped else REPEAT] += 1
            continue
        seen.add(test)
        first, second, flipped = _orient(c["model"], c["control"])
        out.append(
            Finding(name, asked, first, second, where(c), kind(c, flipped), flipped, comparison=c)
        )
    return out, left


def tuned(report: Mapping[str, Any]) -> bool:
    """Whether a study tuned its rows (some row reports a chosen grid value): only such a
    study's verdicts rest on every row at its own best rate."""
    return any(row.get("chosen") for t in report.get("tables", []) for row in t["rows"])


def in_finding(report: Mapping[str, Any]) -> bool:
    """Whether a study makes the finding: tuned, and judged now from the cells it ships (a
    study published before studies shipped their cells keeps the labels of the rules it was
    published under, which today's rules cannot check)."""
    return tuned(report) and bool(report.get("shipped"))


def outside(report: Mapping[str, Any]) -> str:
    """Why a study is not part of the finding ("" where it is)."""
    if not tuned(report):
        return "untuned: every row at one fixed rate"
    if not report.get("shipped"):
        return "published without its cells: labels by the rules of its day"
    return ""


def findings(reports: Iterable[Mapping[str, Any]]) -> tuple[list[Finding], Counter[str]]:
    """Every study's findings, in question order (then study and report order), and what
    was left out of them."""
    out: list[Finding] = []
    left: Counter[str] = Counter()
    for r in reports:
        mine, skipped = study_findings(r)
        out += mine
        left += skipped
    rank = {q: i for i, q in enumerate(QUESTIONS)}
    return sorted(out, key=lambda f: rank.get(f.question, len(QUESTIONS))), left


def by_question(found: Sequence[Finding]) -> dict[str, list[Finding]]:
    """The findings grouped by question, in the order given."""
    groups: dict[str, list[Finding]] = {}
    for f in found:
        groups.setdefault(f.question, []).append(f)
    return groups


def _listed(heading: str, found: Sequence[Finding], limit: int) -> str:
    """A Markdown list item ``heading`` with one sub-item per question:
    ``"the erase term: a; b and 2 more"``."""
    items = [f"- **{heading}**"]
    for asked, mine in by_question(found).items():
        more = f" and {len(mine) - limit} more" if len(mine) > limit else ""
        items.append(f"  - {asked}: " + "; ".join(f.text for f in mine[:limit]) + more)
    return "\n".join(items)


def question_lines(found: Sequence[Finding]) -> list[str]:
    """One Markdown list item per question: its findings' labels counted."""
    return [
        f"- **{asked}**: {counts_text(Counter(f.label for f in mine))}"
        for asked, mine in by_question(found).items()
    ]


def summary(found: Sequence[Finding], left: Mapping[str, int], limit: int = 3) -> list[str]:
    """A sentence of how many findings, then Markdown list items: where the Delta rows win,
    where they lose, what is equivalent, what is open, each with a sub-item per question
    naming its findings, the Delta row first."""
    tally = Counter(f.label for f in found)
    outside = [f"{k} {why if k == 1 else PLURAL.get(why, why)}" for why, k in sorted(left.items())]
    crossings = sum(f.crossover is not None for f in found)
    plural = "" if len(found) == 1 else "s"
    lines = [
        f"{len(found)} distinct finding{plural}: {counts_text(tally) or 'none'} (each test "
        "once: identical per-seed data are one test, and a comparison followed over a "
        f"swept knob is one finding, {crossings or 'none'} here"
        + (f"; left out: {', '.join(outside)}" if outside else "")
        + ")."
    ]
    delta = [f for f in found if is_delta(f.first)]
    for label, opening in ((WIN, "Where a Delta row wins"), (LOSS, "Where a Delta row loses")):
        chosen = [f for f in delta if f.label == label]
        lines.append(
            _listed(opening, chosen, limit)
            if chosen
            else f"- **{opening}**: nowhere among these findings."
        )
    equal = [f for f in found if f.label == EQUIVALENT]
    if equal:
        lines.append(
            _listed(
                "Equivalent within the task's margin (the TOST's 90% interval inside it)",
                equal,
                limit,
            )
        )
    within = [f for f in found if f.label == WITHIN_MARGIN]
    if within:
        lines.append(
            _listed(
                "Significantly different, by less than the margin (so not equivalent)",
                within,
                limit,
            )
        )
    still = [f for f in found if f.label in (INCONCLUSIVE, NO_CROSSOVER)]
    if still:
        lines.append(
            _listed(
                f"Open ({NO_DIFFERENCE} at the size each test could see, or no crossover in range)",
                still,
                1,
            )
        )
    return lines
