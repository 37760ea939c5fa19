"""Tasks' stated expectations, checked against the measured seeds.

A task may claim, with a reason, how one model should fare (see :class:`Expectation`).
The report states for each claim whether the run confirmed or contradicted it, plainly
either way: a contradicted expectation is a finding, not an error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .._task import Expectation, make_task
from ..experiment.config import COUNTED
from ..experiment.store import RunResult


@dataclass(frozen=True)
class Verdict:
    """One expectation of one task, judged on the cells that match it.

    ``verdict`` is ``"confirmed"`` (holds on every seed), ``"contradicted"`` (on none),
    ``"mixed"`` or ``"not run"`` (no matching cell finished).
    """

    task: str
    expectation: Expectation
    models: tuple[str, ...]
    values: tuple[float, ...]
    verdict: str

    @property
    def claim(self) -> str:
        e = self.expectation
        options = ", ".join(f"{k}={v}" for k, v in e.overrides.items())
        who = f"{e.model} ({options})" if options else e.model
        return f"{who}: {e.split} metric {e.comparison} {e.value:.4g}"


def matches(row: RunResult, expectation: Expectation) -> bool:
    """A cell matches when its family and the expectation's option overrides agree; an
    expectation without overrides is about the family's plain entry (label = name)."""
    if row.config.get("model") != expectation.model:
        return False
    if not expectation.overrides:
        return row.model == expectation.model
    options = row.config.get("config", {})
    return all(options.get(k) == v for k, v in expectation.overrides.items())


def _value(row: RunResult, split: str) -> float | None:
    metrics = row.metrics
    value = metrics.get("test") if split == "test" else metrics.get("ood", {}).get(split)
    return None if value is None else float(value)


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
        for expectation in task.expectations:
            hits = [r for r in task_rows if r.status in COUNTED and matches(r, expectation)]
            pairs = [(r.model, v) for r in hits if (v := _value(r, expectation.split)) is not None]
            held = [expectation.holds(v) for _, v in pairs]
            if not held:
                verdict = "not run"
            elif all(held):
                verdict = "confirmed"
            elif not any(held):
                verdict = "contradicted"
            else:
                verdict = "mixed"
            verdicts.append(Verdict(
                task=label,
                expectation=expectation,
                models=tuple(sorted({m for m, _ in pairs})),
                values=tuple(v for _, v in pairs),
                verdict=verdict,
            ))
    return verdicts
