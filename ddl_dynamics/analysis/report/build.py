"""The report: the verdicts first, then the evidence they rest on.

`build_report` reads a run folder once (`load_run`) and turns it into

- **comparisons**: per task, every row against its baseline (the label its cells name in
  ``config["baseline"]``) and every comparison the experiment declares
  (``[[comparisons]]``), each drawn and labelled by the rule book (`verdicts`):
  win / loss / equivalent / inconclusive on Holm-adjusted p-values over every test of the
  report, or no test (unequal budget, unmatched size) with the reason;
- **expectations**: the tasks' claims, judged as comparisons of the same family
  (`expectations`);
- **crossovers**: the comparisons followed across a swept knob (`crossover`);
- **tables**: per task, one row per model at its chosen grid value: n = finished seeds /
  seeds run, the per-seed test values beside their mean ± 95% CI, the chosen value, params
  and their ratio to the baseline's, and the ODE reconstruction flag; every failed seed and
  every earlier attempt listed;
- **regimes**: the gate regimes the trained Delta stacks use;
- **mixing**: how far the trained stream-mixing stacks moved their mixing matrices
  (`mixing`).

The cell text of its tables lives in `text`, the renderers in ``analysis.render``.
"""

from __future__ import annotations

import math
import tomllib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..._task import make_task
from ...experiment.config import COUNTED
from ...experiment.folder import RunFolder
from ...experiment.grid import grid_value, point_text
from ...experiment.result import STATUSES, RunResult
from ...models.operator import REGIMES
from ..judge.comparisons import Comparison, Request, judge
from ..judge.crossover import Crossover, crossovers
from ..judge.expectations import Verdict, expectation_requests, judge_expectations
from ..judge.regimes import regime_fractions
from ..judge.stats import Estimate
from ..judge.verdicts import flagged
from ..mixing import MixingRow, mixing_rows
from ..probes import erases, load_probes, probe_run, usable_rows
from ..run import Row, Run, in_tasks, load_run


@dataclass(frozen=True)
class ModelRow:
    """One model on one task, at its chosen grid value, over its seeds.

    ``per_seed`` maps every seed run to its test value, or to its status when the cell
    did not finish; ``flagged`` lists the seeds whose ODE reconstruction error exceeded its
    tolerance (the solver, not only the model, shaped the result); ``chosen`` the grid value
    chosen on val (empty: not tuned); ``retries`` how many earlier attempts later ones
    replaced; ``older`` how many cells of an older config of the row are left out.
    """

    model: str
    baseline: str | None
    statuses: dict[str, int]
    per_seed: dict[int, float | str]
    test: Estimate
    val: Estimate
    train: Estimate
    ood: dict[str, Estimate]
    extra: dict[str, Estimate]
    params: float | None
    params_ratio: float | None
    flops: float | None
    nfe_forward: float | None
    nfe_backward: float | None
    wall_time: float | None
    flagged: tuple[int, ...] = ()
    chosen: str = ""
    retries: int = 0
    older: int = 0

    @property
    def finished(self) -> int:
        return sum(self.statuses.get(s, 0) for s in COUNTED)

    @property
    def run(self) -> int:
        return sum(self.statuses.values())


@dataclass(frozen=True)
class Problem:
    """A cell that did not finish cleanly (one seed), an earlier attempt at a cell, or an
    OOD split some models could not run (``seed`` None, ``model`` lists them)."""

    model: str
    seed: int | None
    status: str
    message: str


@dataclass(frozen=True)
class TaskTable:
    task: str
    metric: str
    higher_is_better: bool
    ood_splits: list[str]
    extras: list[str]
    rows: list[ModelRow]
    problems: list[Problem] = field(default_factory=list)
    #: The metric's chance or shortcut level (`Task.floor`); None where the task states none.
    floor: float | None = None

    @property
    def has_val(self) -> bool:
        return any(r.val.n for r in self.rows)

    @property
    def tuned(self) -> bool:
        return any(r.chosen for r in self.rows)


@dataclass(frozen=True)
class RegimeRow:
    """Which gate regimes one trained Delta stack uses on one task (test split, all seeds),
    against the regimes the task says it needs (``stated``; empty for controls)."""

    task: str
    model: str
    fractions: dict[str, float]
    dominant: str
    stated: tuple[str, ...]

    @property
    def share_stated(self) -> float | None:
        """Fraction of gates in the stated regimes (None for a control task)."""
        return sum(self.fractions[r] for r in self.stated) if self.stated else None


@dataclass(frozen=True)
class Report:
    """A run's report, in reading order: comparisons, expectations, crossovers (where a
    task's knob is swept), tables, regimes, stream mixing. ``tests`` is the size of the
    family of p-values Holm adjusts over."""

    name: str
    run_dir: str
    experiment: dict[str, Any]
    comparisons: list[Comparison]
    expectations: list[Verdict]
    tables: list[TaskTable]
    regimes: list[RegimeRow] = field(default_factory=list)
    crossovers: list[Crossover] = field(default_factory=list)
    tests: int = 0
    #: Cells trained for the rows shown, at every grid value (the tables show the chosen).
    trained: int = 0
    #: How far the latest run got, where the store says (``"3 of 12 cells; run unfinished"``).
    progress: str = ""
    #: What kind of run it is: the experiment file's ``description``.
    description: str = ""
    #: How far the trained stream-mixing stacks moved their mixing matrices.
    mixing: list[MixingRow] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[str]:
        """The statuses of the cells the tables show."""
        return sum((Counter(r.statuses) for t in self.tables for r in t.rows), Counter())

    @property
    def cells_text(self) -> str:
        """``"24 ok"``, or ``"24 ok at the chosen grid values, of 72 trained"``, then how far
        an unfinished run got."""
        shown = status_text(self.statuses) or "none"
        count = sum(self.statuses.values())
        text = (
            shown
            if self.trained == count
            else (f"{shown} at the chosen grid values, of {self.trained} trained")
        )
        return f"{text} ({self.progress})" if self.progress else text


def status_text(counts: dict[str, int]) -> str:
    """``"3 ok, 1 diverged"``: the count of each status present, in the store's order."""
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))


def build_report(run: Run | RunFolder | str | Path) -> Report:
    """Aggregate a run folder (open, or a path), or a run read once: comparisons,
    expectations, crossovers, tables, regimes, stream mixing."""
    run = run if isinstance(run, Run) else load_run(run)
    requests = _requests(run)
    pending = expectation_requests(run)
    judged = judge(run, [*requests, *(r for _, _, r in pending if isinstance(r, Request))])
    higher = {task: next(iter(run.task_rows(task).values())).higher_is_better for task in run.tasks}
    comparisons = [judged[r.key] for r in requests]
    drawn = {
        (c.task, frozenset((c.model, c.control_text)), c.split)  # a mirror is one test
        for c in judged.values()
        if c.p_adjusted is not None
    }
    name = run.experiment.get("name") or run.run_dir.name
    return Report(
        name,
        str(run.run_dir),
        run.experiment,
        comparisons,
        judge_expectations(pending, judged, higher),
        [_table(run, task) for task in run.tasks],
        _regimes(run),
        crossovers(run, comparisons, judged.values()),
        len(drawn),
        sum(len(row.cells) for row in run.rows.values()),
        _unfinished(run),
        _description(run),
        mixing_rows(run),
    )


def _description(run: Run) -> str:
    """The experiment file's ``description``, as the run recorded the file."""
    try:
        found = tomllib.loads(run.experiment.get("config") or "").get("description", "")
    except tomllib.TOMLDecodeError:
        return ""
    return " ".join(found.split()) if isinstance(found, str) else ""


def _unfinished(run: Run) -> str:
    """How far the latest run got, where it has not finished every cell it selected."""
    progress = run.progress
    done = progress is None or (progress.ended and progress.finished == progress.selected)
    return "" if done else str(progress)


def _requests(run: Run) -> list[Request]:
    """Each row against its baseline, then the experiment's declared comparisons, per task."""
    requests = []
    for task in run.tasks:
        rows = run.task_rows(task)
        requests += [
            Request(task, label, baseline, "baseline")
            for label in sorted(rows)
            if (baseline := run.baseline(task, label)) in rows
        ]
        metric = next(iter(rows.values())).described.get("metric", "")
        requests += [
            Request(
                task,
                c.model,
                c.control,
                "declared",
                c.split,
                c.threshold(metric),
                c.control_larger,
            )
            for c in run.comparisons
            if c.model in rows and c.control in rows and in_tasks(task, c.tasks)
        ]
    return list({r.key: r for r in requests}.values())


def _regimes(run: Run) -> list[RegimeRow]:
    """Gate-regime use of every shown Delta stack with the erase term and stored weights,
    pooled over seeds, and where a layer takes several updates also of each update apart
    (``ddl-product (update 2)``): the report probes those it shows that are not probed yet,
    so the table never depends on which probes happen to be kept."""
    betas: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    stated: dict[str, tuple[str, ...]] = {}
    if run.folder is not None:
        probe_run(run, progress=False, rows=[r for r in usable_rows(run) if erases(r)])
    for row, arrays in load_probes(run):
        if erases(row):
            betas[row.task, row.model].append(arrays["beta"])
            for h in np.unique(arrays.get("update", [])).astype(int):  # ddl-product's updates
                label = f"{row.model} (update {h + 1})"
                betas[row.task, label].append(arrays["beta"][:, arrays["update"] == h])
            if row.task not in stated:
                stated[row.task] = make_task(row.config["task"], **row.config["spec"]).regimes
    rows = []
    for (task, model), chunks in sorted(betas.items()):
        fractions = regime_fractions(np.concatenate(chunks)).mean(0)
        rows.append(
            RegimeRow(
                task,
                model,
                dict(zip(REGIMES, map(float, fractions), strict=True)),
                REGIMES[int(fractions.argmax())],
                stated[task],
            )
        )
    return rows


def _table(run: Run, task: str) -> TaskTable:
    """One task's rows, baselines first, with what went wrong in them."""
    models = run.task_rows(task)
    every = [c for row in models.values() for c in row.selected]
    described = next(iter(models.values())).described
    splits = sorted({s for r in every for s in r.metrics.get("ood", {})})
    extras = sorted(
        {e for r in every for e in _extras(r)}, key=lambda e: (e in _ODE_EXTRAS.values(), e)
    )
    baselines = {label: run.baseline(task, label) for label in models}
    order = sorted(models, key=lambda m: (m not in baselines.values(), m))
    rows, problems = [], []
    skipped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for model in order:
        base = models.get(baselines[model] or "")
        rows.append(_model_row(models[model], model, baselines[model], base, splits, extras))
        problems += _problems(models[model], model)
        for r in models[model].selected:
            for split, reason in r.metrics.get("skipped", {}).items():
                if model not in skipped[split, reason]:
                    skipped[split, reason].append(model)
    problems += [
        Problem(", ".join(labels), None, f"{split} not run", reason)
        for (split, reason), labels in skipped.items()
    ]
    config = every[0].config if every else {}
    floor = make_task(config["task"], **config.get("spec", {})).floor if "task" in config else None
    return TaskTable(
        task,
        described.get("metric", "metric"),
        bool(described.get("higher_is_better", False)),
        splits,
        extras,
        rows,
        problems,
        floor,
    )


def _model_row(
    row: Row,
    model: str,
    baseline: str | None,
    base: Row | None,
    splits: Sequence[str],
    extras: Sequence[str],
) -> ModelRow:
    """A row's figures over its shown cells: counts, estimates, size against its baseline's."""
    group = row.selected
    ok = [r for r in group if r.status in COUNTED]
    params = Estimate.of([r.params for r in group]).mean
    reference = Estimate.of([r.params for r in base.selected] if base else []).mean
    return ModelRow(
        model=model,
        baseline=baseline,
        statuses=dict(Counter(r.status for r in group)),
        per_seed={
            r.seed: (r.metrics.get("test", math.nan) if r.status in COUNTED else r.status)
            for r in group
        },
        test=Estimate.of([r.metrics.get("test") for r in ok]),
        val=Estimate.of([r.metrics.get("val") for r in ok]),
        train=Estimate.of([r.metrics.get("train") for r in ok]),
        ood={s: Estimate.of([r.metrics.get("ood", {}).get(s) for r in ok]) for s in splits},
        extra={e: Estimate.of([_extras(r).get(e) for r in ok]) for e in extras},
        params=params,
        params_ratio=params / reference if params and reference else None,
        flops=Estimate.of([r.flops for r in ok]).mean,
        nfe_forward=Estimate.of([r.nfe_forward for r in ok]).mean,
        nfe_backward=Estimate.of([r.nfe_backward for r in ok]).mean,
        wall_time=Estimate.of([r.wall_time for r in group]).mean,
        flagged=flagged(ok),
        chosen=row.chosen_text(),
        retries=len(row.attempts),
        older=row.older,
    )


def _problems(row: Row, model: str) -> list[Problem]:
    """What went wrong in a row: cells that did not count, earlier attempts, seeds from
    different ensembles, an older config left out."""
    problems = [
        Problem(model, r.seed, r.status, r.message) for r in row.selected if r.status not in COUNTED
    ]
    problems += [
        Problem(
            model,
            a.seed,
            f"{a.status}, then retried",
            f"{_attempt_at(row, a)}{a.message or 'no message'} (attempt of {a.created_at})",
        )
        for a in row.attempts
    ]
    if row.ensembles:
        problems.append(
            Problem(
                model,
                None,
                "seeds trained in different ensembles",
                f"in {len(row.ensembles)} ensembles of "
                f"{', '.join(map(str, row.ensembles))} cells (a resumed "
                "run, or --seeds or --no-vectorize between runs): their "
                "last bits differ by the float rounding of folding",
            )
        )
    if row.older:
        problems.append(
            Problem(
                model,
                None,
                "older config left out",
                f"{row.older} cell(s) of an earlier version of this row's "
                "config are in the store but not in this report",
            )
        )
    return problems


def _attempt_at(row: Row, attempt: RunResult) -> str:
    """``"at lr=0.01: "`` for an attempt of a tuned row, else empty."""
    values = point_text(list(row.grid), grid_value(attempt.config, list(row.grid)))
    return f"at {values}: " if values else ""


#: ODE checks shown beside the task's extras, after them: metrics key → column name.
_ODE_EXTRAS = {"nfe_test": "NFE (test)", "reconstruction_error": "recon. error"}


def _extras(row: RunResult) -> dict[str, float]:
    """Task extras plus the ODE checks, under readable names."""
    found = dict(row.metrics.get("extra", {}))
    for key, name in _ODE_EXTRAS.items():
        if row.metrics.get(key) is not None:
            found[name] = row.metrics[key]
    return found
