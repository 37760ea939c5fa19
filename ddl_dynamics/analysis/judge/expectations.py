"""Tasks' stated expectations, judged against the measured seeds.

A task claims, with a reason, that one model is better or worse than a control (another
model, or an analytic bound) on a split's metric (see `Expectation`). Each claim
becomes a comparison of the report (`Request`), drawn and adjusted
with all the others, and reads (`claim_verdict`)

- ``confirmed``: the comparison's label is a win (claimed better) or a loss (worse);
- ``contradicted``: the opposite label, or equivalence within the task's margin (unless
  the claimed side is significantly ahead, by less than the margin: insufficient);
- ``insufficient evidence``: anything else — inconclusive, unequal budgets or sizes, a
  claim on an out-of-distribution split whose rows did not first solve the trained split,
  or a model or control that is not in the run. The note says which.

Plainly either way: a contradicted expectation is a finding, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..._task import Expectation, Subject, make_task
from ...experiment.result import RunResult
from ...models.base import MODELS, model_options
from ..run import Run
from .comparisons import Comparison, Request
from .verdicts import EQUIVALENT, INSUFFICIENT, claim_verdict, size_gap

#: Options that size a model: the experiment sets (and matches) them, a claim never does.
SIZES = ("width", "depth", "hidden")


@dataclass(frozen=True)
class Verdict:
    """One expectation of one task, judged on the cells that match it.

    ``model`` and ``control`` are the matched labels (``control`` None for a bound, either
    None when nothing matched); ``comparison`` is the judged comparison (None when nothing
    matched); ``note`` says what limits the verdict (empty when nothing does).
    """

    task: str
    expectation: Expectation
    higher_is_better: bool
    model: str | None
    control: str | None
    comparison: Comparison | None
    verdict: str
    note: str = ""

    @property
    def claim(self) -> str:
        e = self.expectation
        control = e.control if isinstance(e.control, Subject) else f"{e.control:.4g}"
        return f"{e.model} {e.relation} than {control} on {e.split}"


def _option(row: RunResult, name: str) -> object:
    """A resolved model option of a cell; a row stored before the option existed has the
    family's default."""
    options = row.config.get("config", {})
    if name in options:
        return options[name]
    return model_options(row.config["model"]).get(name, (None, None))[0]


def match(
    subject: Subject, rows: Sequence[RunResult], partner: RunResult | None = None
) -> list[str]:
    """The labels among ``rows`` (one task) that ``subject`` names: the family's entries
    with the stated options, narrowed to those at the family's defaults on every other
    option where the entries differ (sizes aside), and where entries of several sizes remain
    (a compute-matched wider baseline beside the plain one), to those of ``partner``'s size,
    the other side of the claim."""
    if subject.family not in MODELS:
        return []
    found = {
        r.model: r
        for r in rows
        if r.config.get("model") == subject.family
        and all(_option(r, k) == v for k, v in subject.options.items())
    }
    if len(found) < 2:
        return sorted(found)
    defaults = {k: d for k, (d, _) in model_options(subject.family).items()}
    names = {k for r in found.values() for k in r.config.get("config", {})}
    varied = {
        k
        for k in names - set(SIZES) - set(subject.options)
        if len({repr(_option(r, k)) for r in found.values()}) > 1
    }
    kept = sorted(
        label for label, r in found.items() if all(_option(r, k) == defaults.get(k) for k in varied)
    )
    sized = [
        label for label in kept if partner is not None and not size_gap([found[label]], [partner])
    ]
    return sized if len(kept) > 1 and len(sized) == 1 else kept


def expectation_requests(run: Run) -> list[tuple[str, Expectation, Request | str]]:
    """Every expectation of every task of the run, with the comparison that judges it
    (`request_for`)."""
    found: list[tuple[str, Expectation, Request | str]] = []
    for task_label in run.tasks:
        cells = [row.cells[0] for row in run.task_rows(task_label).values()]
        config = cells[0].config
        if "task" in config:  # else a row stored without its resolved config
            task = make_task(config["task"], **config.get("spec", {}))
            found += [(task_label, e, request_for(task_label, e, cells)) for e in task.expectations]
    return found


def request_for(task: str, expectation: Expectation, cells: Sequence[RunResult]) -> Request | str:
    """The comparison that judges a claim on a task (``cells``: one of each row), or why
    there is none: its model or control is not singled out among the rows (`match`)."""
    e = expectation
    # (a family name became a Subject when the expectation was made: a control is one or
    # a number)
    subjects = [("model", cast(Subject, e.model))] + (
        [("control", e.control)] if isinstance(e.control, Subject) else []
    )
    labels: dict[str, str] = {}
    by_label = {c.model: c for c in cells}
    for role, subject in subjects:
        matched = match(subject, cells, by_label.get(labels.get("model", "")))
        if len(matched) != 1:
            return (
                f"several entries match the {role} {subject}: {', '.join(matched)}"
                if matched
                else f"no cell of the {role} {subject} in this run"
            )
        labels[role] = matched[0]
    return Request(
        task,
        labels["model"],
        labels.get("control", cast(float, e.control)),
        "expectation",
        e.split,
        e.requires,
    )


def judge_expectations(
    pending: list[tuple[str, Expectation, Request | str]],
    comparisons: Mapping[tuple[Any, ...], Comparison],
    higher: Mapping[str, bool],
) -> list[Verdict]:
    """The verdict on each expectation from its judged comparison (``higher``: per task,
    whether its metric is better higher)."""
    verdicts = []
    for task, e, request in pending:
        if isinstance(request, str):
            verdicts.append(Verdict(task, e, higher[task], None, None, None, INSUFFICIENT, request))
            continue
        c = comparisons[request.key]
        result = (
            INSUFFICIENT if c.asked_split else claim_verdict(c.label, e.relation, c.significant())
        )
        note = c.note
        if c.label == EQUIVALENT:
            note = "; ".join(n for n in ("equivalent within the task's margin", note) if n)
        elif result == INSUFFICIENT and c.paired is not None and not c.asked_split:
            note = "; ".join(n for n in (f"{c.label}, n = {c.paired.n}", note) if n)
        verdicts.append(
            Verdict(
                task,
                e,
                c.higher_is_better,
                request.model,
                request.control if isinstance(request.control, str) else None,
                c,
                result,
                note,
            )
        )
    return verdicts
