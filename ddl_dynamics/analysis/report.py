"""The report: per task, one row per model, aggregated over seeds.

:func:`build_report` turns a run folder's store into structured tables; renderers in
:data:`RENDERERS` turn those into text (``md``, ``csv``, ``json``). Numbers are
mean ± the half-width of a 95% t-interval over seeds; the p-value is Welch's t-test of a
model's test metric against the additive baseline (``resnet``). Statistics use the
cells that finished ``ok`` or ``capped``; failed and diverged cells are counted in the
status column and listed under their task, never dropped silently.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from .._task import make_task
from ..experiment.config import COUNTED
from ..experiment.store import STATUSES, ResultStore, RunResult, store_path
from ..models.operator import REGIMES
from .expectations import Verdict, check_expectations
from .probes import erases, load_probes
from .regimes import regime_fractions


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided t confidence interval (None when n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sem


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's unequal-variance t-test; None below 2 samples each
    or when both samples are constant."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return None
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(2 * stats.t.sf(abs(t), df))


@dataclass(frozen=True)
class Estimate:
    """A figure over seeds: mean, 95% CI half-width (None for n = 1), seeds used."""

    mean: float | None = None
    ci: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Estimate:
        finite = [v for v in values if v is not None and math.isfinite(v)]
        return cls(*mean_ci(finite), len(finite)) if finite else cls()


@dataclass(frozen=True)
class ModelRow:
    model: str
    statuses: dict[str, int]
    test: Estimate
    train: Estimate
    ood: dict[str, Estimate]
    extra: dict[str, Estimate]
    p_value: float | None
    params: float | None
    flops: float | None
    nfe_forward: float | None
    nfe_backward: float | None
    wall_time: float | None


@dataclass(frozen=True)
class Problem:
    """A cell that did not finish cleanly (one seed), or an OOD split some models could
    not run (``seed`` None, ``model`` lists them)."""

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
    name: str
    run_dir: str
    baseline: str
    experiment: dict[str, Any]
    tables: list[TaskTable]
    expectations: list[Verdict] = field(default_factory=list)
    regimes: list[RegimeRow] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[str]:
        return sum((Counter(r.statuses) for t in self.tables for r in t.rows), Counter())


def build_report(run_dir: str | Path, baseline: str = "resnet") -> Report:
    """Aggregate a run folder's results into one table per task."""
    path = store_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no results store (results.sqlite) here")
    store = ResultStore(path)
    latest: dict[tuple[str, str, int], RunResult] = {}
    for row in store.rows():  # ordered by created_at within a cell: the newest config wins
        latest[(row.task, row.model, row.seed)] = row
    by_task: dict[str, dict[str, list[RunResult]]] = defaultdict(lambda: defaultdict(list))
    for (task, model, _), row in latest.items():
        by_task[task][model].append(row)
    experiment = store.experiment() or {}
    tables = [_table(task, models, baseline) for task, models in sorted(by_task.items())]
    name = experiment.get("name") or Path(run_dir).name
    return Report(name, str(run_dir), baseline, experiment, tables,
                  check_expectations(list(latest.values())), _regimes(Path(run_dir)))


def _regimes(run_dir: Path) -> list[RegimeRow]:
    """Gate-regime use of every probed Delta stack, pooled over seeds (needs probes)."""
    betas: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    stated: dict[str, tuple[str, ...]] = {}
    for row, arrays in load_probes(run_dir):
        if erases(row):
            betas[row.task, row.model].append(arrays["beta"])
            if row.task not in stated:
                stated[row.task] = make_task(row.config["task"], **row.config["spec"]).regimes
    rows = []
    for (task, model), chunks in sorted(betas.items()):
        fractions = regime_fractions(np.concatenate(chunks)).mean(0)
        rows.append(RegimeRow(task, model, dict(zip(REGIMES, map(float, fractions), strict=True)),
                              REGIMES[int(fractions.argmax())], stated[task]))
    return rows


def _table(task: str, models: dict[str, list[RunResult]], baseline: str) -> TaskTable:
    def counted(rows: list[RunResult]) -> list[RunResult]:
        return [r for r in rows if r.status in COUNTED]

    def test_values(rows: list[RunResult]) -> list[float]:
        return [v for r in counted(rows) if _finite(v := r.metrics.get("test"))]

    every = [r for rows in models.values() for r in rows]
    described = next((r.metrics for r in every if "metric" in r.metrics), {})
    splits = sorted({s for r in every for s in r.metrics.get("ood", {})})
    extras = sorted({e for r in every for e in _extras(r)},
                    key=lambda e: (e in _ODE_EXTRAS.values(), e))
    reference = test_values(models.get(baseline, []))
    order = sorted(models, key=lambda m: (m != baseline, m))
    rows, problems = [], []
    skipped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for model in order:
        group = sorted(models[model], key=lambda r: r.seed)
        ok = counted(group)
        rows.append(ModelRow(
            model=model,
            statuses=dict(Counter(r.status for r in group)),
            test=Estimate.of([r.metrics.get("test") for r in ok]),
            train=Estimate.of([r.metrics.get("train") for r in ok]),
            ood={s: Estimate.of([r.metrics.get("ood", {}).get(s) for r in ok]) for s in splits},
            extra={e: Estimate.of([_extras(r).get(e) for r in ok]) for e in extras},
            p_value=None if model == baseline else welch_p(test_values(group), reference),
            params=Estimate.of([r.params for r in group]).mean,
            flops=Estimate.of([r.flops for r in ok]).mean,
            nfe_forward=Estimate.of([r.nfe_forward for r in ok]).mean,
            nfe_backward=Estimate.of([r.nfe_backward for r in ok]).mean,
            wall_time=Estimate.of([r.wall_time for r in group]).mean,
        ))
        for r in group:
            if r.status != "ok":
                problems.append(Problem(model, r.seed, r.status, r.message))
            for split, reason in r.metrics.get("skipped", {}).items():
                if model not in skipped[split, reason]:
                    skipped[split, reason].append(model)
    problems += [Problem(", ".join(labels), None, f"{split} not run", reason)
                 for (split, reason), labels in skipped.items()]
    return TaskTable(task, described.get("metric", "metric"),
                     bool(described.get("higher_is_better", False)), splits, extras, rows,
                     problems)


#: ODE checks shown beside the task's extras, after them: metrics key → column name.
_ODE_EXTRAS = {"nfe_test": "NFE (test)", "reconstruction_error": "recon. error"}


def _extras(row: RunResult) -> dict[str, float]:
    """Task extras plus the ODE checks, under readable names."""
    found = dict(row.metrics.get("extra", {}))
    for key, name in _ODE_EXTRAS.items():
        if row.metrics.get(key) is not None:
            found[name] = row.metrics[key]
    return found


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


# --- renderers

def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _est(e: Estimate) -> str:
    if e.mean is None:
        return "—"
    return _num(e.mean) if e.ci is None else f"{_num(e.mean)} ± {_num(e.ci, 2)}"


def _p(value: float | None) -> str:
    return "—" if value is None else ("<0.001" if value < 0.001 else f"{value:.3f}")


def _status(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))


def who(problem: Problem, code: Callable[[str], str] = str) -> str:
    """Who a problem is about: the model label(s), and the seed when it is one cell's."""
    models = ", ".join(code(m) for m in problem.model.split(", "))
    return models if problem.seed is None else f"{models} seed {problem.seed}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_cells(table: TaskTable, baseline: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one task's table, shared by the text and HTML renderers."""
    arrow = "↑" if table.higher_is_better else "↓"
    head = ["model", f"test {arrow}", f"train {arrow}",
            *(f"{s} {arrow}" for s in table.ood_splits), *table.extras,
            f"p vs {baseline}", "params", "FLOPs/sample", "NFE fwd/bwd", "time (s)", "status"]
    rows = []
    for r in table.rows:
        nfe = ("—" if r.nfe_forward is None
               else f"{_num(r.nfe_forward, 3)}/{_num(r.nfe_backward, 3)}")
        rows.append([r.model, _est(r.test), _est(r.train),
                     *(_est(r.ood[s]) for s in table.ood_splits),
                     *(_est(r.extra[e]) for e in table.extras),
                     "ref" if r.model == baseline else _p(r.p_value),
                     _num(r.params, 6), _num(r.flops, 3), nfe, _num(r.wall_time, 3),
                     _status(r.statuses)])
    return head, rows


def expectation_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task expectation: the claim, its reason, the measured seeds, verdict."""
    head = ["task", "claim", "reason", "measured (per seed)", "verdict"]
    rows = [[v.task, v.claim, v.expectation.reason,
             ", ".join(f"{x:.4g}" for x in v.values) or "—", v.verdict]
            for v in report.expectations]
    return head, rows


def regime_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task × Delta stack: share of gates per regime, dominant vs stated."""
    head = ["task", "model", *REGIMES, "dominant", "stated", "share in stated"]
    rows = []
    for r in report.regimes:
        share = r.share_stated
        rows.append([r.task, r.model, *(f"{r.fractions[g]:.0%}" for g in REGIMES), r.dominant,
                     " / ".join(r.stated) or "(control)",
                     "—" if share is None else f"{share:.0%}"])
    return head, rows


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured markdown."""
    exp = report.experiment
    versions = exp.get("versions", {})
    machine = exp.get("machine", {})
    lines = [f"# Experiment `{report.name}`", ""]
    lines.append(f"Run folder `{report.run_dir}`; cells: {_status(report.statuses) or 'none'}.")
    if versions:
        lines.append("Software: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    if machine:
        lines.append(f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} CPUs"
                     + (f", {machine['cuda']}" if "cuda" in machine else "") + ".")
    lines += ["", "Mean ± 95% CI over seeds (a bare mean: one seed); p: Welch's t-test of the "
              f"test metric against `{report.baseline}`; ↑/↓: higher/lower is better.", ""]
    for table in report.tables:
        arrow = "↑" if table.higher_is_better else "↓"
        lines += [f"## {table.task} — {table.metric} {arrow}", ""]
        lines += _md_table(*table_cells(table, report.baseline))
        if table.problems:
            lines += ["", "Cells that did not finish cleanly, and splits not run:", ""]
            lines += [f"- {who(p, lambda m: f'`{m}`')}: **{p.status}** — {_md_escape(p.message)}"
                      for p in table.problems]
        lines.append("")
    if report.expectations:
        lines += ["## Expectations against the measured seeds", ""]
        lines += [*_md_table(*expectation_cells(report)), ""]
    if report.regimes:
        lines += ["## Gate regimes used by the trained Delta stacks (test split)", "",
                  "Share of (sample, layer) gates per regime, pooled over seeds, for the `ddl` "
                  "family (with `ddl-write`, β only scales a write).", ""]
        lines += [*_md_table(*regime_cells(report)), ""]
    return "\n".join(lines)


def _flat_rows(report: Report) -> list[dict[str, Any]]:
    """One flat dict per task × model, the shape of the CSV."""
    out = []
    for table in report.tables:
        for r in table.rows:
            row: dict[str, Any] = {
                "task": table.task, "model": r.model, "metric": table.metric,
                "higher_is_better": table.higher_is_better, "n": r.test.n,
                **{s: r.statuses.get(s, 0) for s in STATUSES},
                "test_mean": r.test.mean, "test_ci": r.test.ci,
                "train_mean": r.train.mean, "train_ci": r.train.ci,
                "p_value": r.p_value, "params": r.params, "flops": r.flops,
                "nfe_forward": r.nfe_forward, "nfe_backward": r.nfe_backward,
                "wall_time": r.wall_time,
            }
            for prefix, group in (("ood", r.ood), ("extra", r.extra)):
                for name, e in group.items():
                    row[f"{prefix}:{name}_mean"], row[f"{prefix}:{name}_ci"] = e.mean, e.ci
            out.append(row)
    return out


def render_csv(report: Report) -> str:
    rows = _flat_rows(report)
    columns = list(dict.fromkeys(c for row in rows for c in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def render_json(report: Report) -> str:
    return json.dumps(_json_safe(dataclasses.asdict(report)), indent=1, ensure_ascii=False)


#: Output formats by name; add a renderer here to add a format.
RENDERERS: dict[str, Callable[[Report], str]] = {
    "md": render_markdown,
    "csv": render_csv,
    "json": render_json,
}


def render(report: Report, fmt: str = "md") -> str:
    if fmt not in RENDERERS:
        raise ValueError(f"unknown report format {fmt!r}; formats: {', '.join(RENDERERS)}")
    return RENDERERS[fmt](report)


def write_report(run_dir: str | Path, fmt: str = "md", path: str | Path | None = None) -> Path:
    """Render a run folder's report to ``path`` (default ``<run_dir>/report.<fmt>``)."""
    text = render(build_report(run_dir), fmt)
    path = Path(path) if path is not None else Path(run_dir) / f"report.{fmt}"
    path.write_text(text)
    return path
