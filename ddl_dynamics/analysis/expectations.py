"""Tasks' stated expectations, judged against the measured seeds.

A task claims, with a reason, that one model is better or worse than a control (another
model, or an analytic bound) on a split's metric (see :class:`Expectation`). A claim is
judged on the paired per-seed differences (:class:`Paired`) and reads

- ``confirmed``: at least 3 paired finished seeds and p < 0.05 in the claimed direction;
- ``contradicted``: the same evidence in the opposite direction;
- ``insufficient evidence``: anything less — too few seeds, no significant difference, a
  model that did not first succeed in distribution (claims on OOD splits), a model and
  control trained on unequal budgets (:func:`budget_gap`), or a model or control that is
  not in the run. The note says which.

Plainly either way: a contradicted expectation is a finding, not an error.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .._task import Expectation, Subject, make_task
from ..experiment.config import COUNTED
from ..experiment.store import RunResult
from ..models.base import MODELS, model_options
from .stats import MIN_PAIRS, Paired

CONFIRMED, CONTRADICTED, INSUFFICIENT = "confirmed", "contradicted", "insufficient evidence"
#: The training settings that make a budget: two rows are compared only where they agree.
BUDGET = ("steps", "batch_size", "n_train")
#: Options that size a model: the experiment sets (and matches) them, a claim never does.
SIZES = ("width", "depth", "hidden")


@dataclass(frozen=True)
class Verdict:
    """One expectation of one task, judged on the cells that match it.

    ``model`` and ``control`` are the matched labels (``control`` None for a bound, either
    None when nothing matched); ``paired`` holds n, the mean difference model − control
    with its CI, and p; ``note`` says what limits the verdict (empty when nothing does).
    """

    task: str
    expectation: Expectation
    higher_is_better: bool
    model: str | None
    control: str | None
    paired: Paired | None
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


def match(subject: Subject, rows: Sequence[RunResult]) -> list[str]:
    """The labels among ``rows`` (one task) that ``subject`` names: the family's entries
    with the stated options, narrowed to those at the family's defaults on every other
    option where the entries differ (sizes aside)."""
    if subject.family not in MODELS:
        return []
    found = {r.model: r for r in rows if r.config.get("model") == subject.family
             and all(_option(r, k) == v for k, v in subject.options.items())}
    if len(found) < 2:
        return sorted(found)
    defaults = {k: d for k, (d, _) in model_options(subject.family).items()}
    names = {k for r in found.values() for k in r.config.get("config", {})}
    varied = {k for k in names - set(SIZES) - set(subject.options)
              if len({repr(_option(r, k)) for r in found.values()}) > 1}
    return sorted(label for label, r in found.items()
                  if all(_option(r, k) == defaults.get(k) for k in varied))


def seed_values(rows: Sequence[RunResult], split: str = "test") -> dict[int, float]:
    """Seed → metric on ``split`` of the cells that finished with a finite value there."""
    found = {}
    for r in rows:
        value = r.metrics.get(split) if split in ("train", "val", "test") else r.metrics.get(
            "ood", {}).get(split)
        if r.status in COUNTED and isinstance(value, int | float) and math.isfinite(value):
            found[r.seed] = float(value)
    return found


def budget_gap(model: Sequence[RunResult], control: Sequence[RunResult]) -> str:
    """Why two rows' seeds cannot be compared (``"unequal budgets: ddl steps=150; node
    steps=50"``), or empty when every cell of both trained on the same :data:`BUDGET`.

    A difference between rows trained for different numbers of steps, batches or examples
    measures the budget as much as the model.
    """
    budgets: dict[str, dict[str, set[str]]] = {}
    for r in (*model, *control):
        train = r.config.get("train", {})
        for name in BUDGET:
            budgets.setdefault(r.model, {}).setdefault(name, set()).add(str(train.get(name)))
    differ = [n for n in BUDGET if len(set().union(*(b[n] for b in budgets.values()))) > 1]
    if not differ:
        return ""
    return "unequal budgets: " + "; ".join(
        f"{label} " + ", ".join(f"{n}={'/'.join(sorted(b[n]))}" for n in differ)
        for label, b in budgets.items())


def _failures(rows: Sequence[RunResult], label: str) -> str:
    """``"ddl: 2 of 5 seeds failed (1 capped, 1 diverged)"``, or empty."""
    statuses = Counter(r.status for r in rows if r.model == label)
    failed = {s: n for s, n in statuses.items() if s not in COUNTED}
    if not failed:
        return ""
    kinds = ", ".join(f"{n} {s}" for s, n in sorted(failed.items()))
    return f"{label}: {sum(failed.values())} of {statuses.total()} seeds failed ({kinds})"


def judge(task: str, expectation: Expectation, rows: Sequence[RunResult],
          higher_is_better: bool) -> Verdict:
    """The verdict on one expectation, from one task's rows."""
    e = expectation

    def verdict(model: str | None, control: str | None, paired: Paired | None, result: str,
                *notes: str) -> Verdict:
        return Verdict(task, e, higher_is_better, model, control, paired, result,
                       "; ".join(n for n in notes if n))

    def cells(label: str) -> list[RunResult]:
        return [r for r in rows if r.model == label]

    def values(label: str, split: str) -> dict[int, float]:
        return seed_values(cells(label), split)

    subjects = [("model", e.model)] + ([("control", e.control)]
                                       if isinstance(e.control, Subject) else [])
    labels: dict[str, str] = {}
    for role, subject in subjects:
        found = match(subject, rows)
        if len(found) != 1:
            why = (f"several entries match the {role} {subject}: {', '.join(found)}" if found
                   else f"no cell of the {role} {subject} in this run")
            return verdict(None, None, None, INSUFFICIENT, why)
        labels[role] = found[0]
    model, control = labels["model"], labels.get("control")
    failures = [_failures(rows, label) for label in (model, control) if label]
    if control and (gap := budget_gap(cells(model), cells(control))):
        return verdict(model, control, None, INSUFFICIENT, gap, *failures)
    if e.requires is not None:
        test = values(model, "test").values()
        solved = sum((v >= e.requires) if higher_is_better else (v <= e.requires) for v in test)
        if not test or solved < len(test):
            sign = "≥" if higher_is_better else "≤"
            return verdict(model, control, None, INSUFFICIENT,
                           f"precondition failed: {model} reached test {sign} {e.requires:.4g} "
                           f"on {solved} of {len(test)} finished seeds", *failures)
    paired = Paired.of(values(model, e.split), values(control, e.split) if control else e.control)
    outcome = paired.outcome(higher_is_better)
    if outcome == "too few seeds":
        return verdict(model, control, paired, INSUFFICIENT,
                       f"{paired.n} paired finished seeds, fewer than {MIN_PAIRS}", *failures)
    if outcome == "no difference":
        return verdict(model, control, paired, INSUFFICIENT, "no significant difference",
                       *failures)
    result = CONFIRMED if outcome == e.relation else CONTRADICTED
    return verdict(model, control, paired, result, *failures)


def check_expectations(rows: Sequence[RunResult]) -> list[Verdict]:
    """Judge every expectation of every task in ``rows`` (one task label at a time)."""
    by_task: dict[str, list[RunResult]] = defaultdict(list)
    for row in rows:
        by_task[row.task].append(row)
    verdicts = []
    for label, task_rows in sorted(by_task.items()):
        first = task_rows[0].config
        if "task" not in first:  # a row stored without its resolved config
            continue
        task = make_task(first["task"], **first.get("spec", {}))
        verdicts += [judge(label, e, task_rows, task.higher_is_better)
                     for e in task.expectations]
    return verdicts
