"""The report: the verdicts first, then the evidence they rest on.

:func:`build_report` turns a run folder's store into

- **comparisons**: per task, every model against its baseline (the label its cells name in
  ``config["baseline"]``; cells stored without one: ``resnet``, where the task has it). The
  test metric is compared *paired*, model − baseline per seed over the seeds both finished,
  with the mean difference, its 95% CI, the paired t-test p and, from 6 pairs, the Wilcoxon
  signed-rank p (see :mod:`.stats`); the mark is ``win`` / ``loss`` (p < 0.05 on at least
  3 pairs, direction by the metric), ``tie`` or ``n < 3``;
- **expectations**: the tasks' claims, judged (see :mod:`.expectations`);
- **tables**: per task, one row per model: n = finished seeds / seeds run, the per-seed test
  values beside their mean ± 95% CI, params and their ratio to the baseline's, and the ODE
  reconstruction flag;
- **regimes**: the gate regimes the trained Delta stacks use.

Only cells that finished ``ok`` count (:data:`COUNTED`): a capped, diverged or failed cell
is a failure of that model on that seed, shown in n and in the per-seed values and listed
under its task, never averaged. Renderers in :data:`RENDERERS` turn a report into text
(``md``, ``csv``, ``json``), each opening with the comparisons.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._task import make_task
from ..experiment.config import COUNTED, DEFAULT_BASELINE
from ..experiment.store import STATUSES, RunResult, open_run
from ..models.operator import REGIMES
from .crossover import Crossover, crossovers, star_text
from .expectations import Verdict, budget_gap, check_expectations, seed_values
from .probes import erases, load_probes
from .regimes import regime_fractions
from .stats import WILCOXON_MIN_PAIRS, Estimate, Outcome, Paired

#: A comparison's mark by the outcome of its paired test.
MARKS: dict[Outcome, str] = {"better": "win", "worse": "loss", "no difference": "tie",
                             "too few seeds": "n < 3"}
#: The mark of a comparison between rows trained on unequal budgets: no verdict.
UNEQUAL = "unequal budget"


@dataclass(frozen=True)
class ModelRow:
    """One model on one task, over its seeds.

    ``per_seed`` maps every seed run to its test value, or to its status when the cell
    did not finish; ``flagged`` lists the seeds whose ODE reconstruction error exceeded its
    tolerance (the solver, not only the model, shaped the result).
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

    @property
    def finished(self) -> int:
        return sum(self.statuses.get(s, 0) for s in COUNTED)

    @property
    def run(self) -> int:
        return sum(self.statuses.values())


@dataclass(frozen=True)
class Comparison:
    """One model against its baseline on one task: the paired test-metric difference
    (model − baseline) and its mark; ``finished`` / ``run`` count the model's seeds."""

    task: str
    model: str
    baseline: str
    metric: str
    higher_is_better: bool
    finished: int
    run: int
    paired: Paired
    mark: str


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

    @property
    def has_val(self) -> bool:
        return any(r.val.n for r in self.rows)


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
    task's knob is swept), tables, regimes."""

    name: str
    run_dir: str
    experiment: dict[str, Any]
    comparisons: list[Comparison]
    expectations: list[Verdict]
    tables: list[TaskTable]
    regimes: list[RegimeRow] = field(default_factory=list)
    crossovers: list[Crossover] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[str]:
        return sum((Counter(r.statuses) for t in self.tables for r in t.rows), Counter())


def build_report(run_dir: str | Path) -> Report:
    """Aggregate a run folder's results: comparisons, expectations, tables, regimes."""
    store = open_run(run_dir)
    latest: dict[tuple[str, str, int], RunResult] = {}
    for row in store.rows():  # ordered by created_at within a cell: the newest config wins
        latest[(row.task, row.model, row.seed)] = row
    by_task: dict[str, dict[str, list[RunResult]]] = defaultdict(lambda: defaultdict(list))
    for (task, model, _), row in latest.items():
        by_task[task][model].append(row)
    experiment = store.experiment() or {}
    tables = [_table(task, models) for task, models in sorted(by_task.items())]
    name = experiment.get("name") or Path(run_dir).name
    comparisons = [c for task, models in sorted(by_task.items())
                   for c in _comparisons(task, models)]
    rows = list(latest.values())
    return Report(name, str(run_dir), experiment, comparisons, check_expectations(rows), tables,
                  _regimes(Path(run_dir)),
                  crossovers(rows, [(c.task, c.model, c.baseline, c.paired) for c in comparisons
                                    if c.mark != UNEQUAL]))


def baseline_of(label: str, rows: Sequence[RunResult], labels: Sequence[str]) -> str | None:
    """The baseline label of a model's cells: as stored, else :data:`DEFAULT_BASELINE`
    when the task has it (and the model is not it)."""
    stored = [r.config["baseline"] for r in rows if "baseline" in r.config]
    if stored:
        return stored[-1]
    return DEFAULT_BASELINE if DEFAULT_BASELINE in labels and label != DEFAULT_BASELINE else None


def _comparisons(task: str, models: dict[str, list[RunResult]]) -> list[Comparison]:
    metrics = _described(models)
    higher = bool(metrics.get("higher_is_better", False))
    found = []
    for label in sorted(models):
        rows = models[label]
        baseline = baseline_of(label, rows, list(models))
        if baseline is None:
            continue
        control = models.get(baseline, [])
        paired = Paired.of(seed_values(rows), seed_values(control))
        found.append(Comparison(
            task, label, baseline, metrics.get("metric", "metric"), higher,
            sum(r.status in COUNTED for r in rows), len(rows), paired,
            UNEQUAL if budget_gap(rows, control) else MARKS[paired.outcome(higher)]))
    return found


def _described(models: dict[str, list[RunResult]]) -> dict[str, Any]:
    """How the task's numbers read (metric name, direction), from any row that says."""
    every = (r for rows in models.values() for r in rows)
    return next((r.metrics for r in every if "metric" in r.metrics), {})


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


def _table(task: str, models: dict[str, list[RunResult]]) -> TaskTable:
    every = [r for rows in models.values() for r in rows]
    described = _described(models)
    splits = sorted({s for r in every for s in r.metrics.get("ood", {})})
    extras = sorted({e for r in every for e in _extras(r)},
                    key=lambda e: (e in _ODE_EXTRAS.values(), e))
    baselines = {label: baseline_of(label, rows, list(models)) for label, rows in models.items()}
    order = sorted(models, key=lambda m: (m not in baselines.values(), m))
    rows, problems = [], []
    skipped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for model in order:
        group = sorted(models[model], key=lambda r: r.seed)
        ok = [r for r in group if r.status in COUNTED]
        params = Estimate.of([r.params for r in group]).mean
        reference = Estimate.of([r.params for r in models.get(baselines[model] or "", [])]).mean
        rows.append(ModelRow(
            model=model,
            baseline=baselines[model],
            statuses=dict(Counter(r.status for r in group)),
            per_seed={r.seed: (r.metrics.get("test", math.nan) if r.status in COUNTED
                               else r.status) for r in group},
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
            flagged=tuple(r.seed for r in ok if r.metrics.get("reconstruction_flag")),
        ))
        for r in group:
            if r.status not in COUNTED:
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


# --- renderers

def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _est(e: Estimate) -> str:
    if e.mean is None:
        return "—"
    return _num(e.mean) if e.ci is None else f"{_num(e.mean)} ± {_num(e.ci, 2)}"


def signed(p: Paired) -> str:
    """A paired mean difference, signed, with its CI half-width: ``"-0.41 ± 0.12"``."""
    if p.mean is None:
        return "—"
    mean = f"{p.mean:+.3g}"
    return mean if p.ci is None else f"{mean} ± {_num(p.ci, 2)}"


def _p(value: float | None) -> str:
    return "—" if value is None else ("<0.001" if value < 0.001 else f"{value:.3f}")


def _status(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))


def _finished(finished: int, run: int) -> str:
    """``"3/3"``, or with the success rate when seeds failed: ``"3/5 (60%)"``."""
    return f"{finished}/{run}" if finished == run else f"{finished}/{run} ({finished / run:.0%})"


def _per_seed(values: dict[int, float | str]) -> str:
    """Every seed's value in seed order, a failed seed by its status: ``"1, 1, diverged"``."""
    return ", ".join(v if isinstance(v, str) else _num(v, 3)
                     for _, v in sorted(values.items()))


def _direction(higher_is_better: bool) -> str:
    return "↑" if higher_is_better else "↓"


def who(problem: Problem, code: Callable[[str], str] = str) -> str:
    """Who a problem is about: the model label(s), and the seed when it is one cell's."""
    models = ", ".join(code(m) for m in problem.model.split(", "))
    return models if problem.seed is None else f"{models} seed {problem.seed}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


#: How to read the comparisons, for every renderer that shows them.
COMPARISON_NOTE = (
    "Each model against its baseline on the test metric: model − baseline per seed, over "
    "the seeds both finished (same data and initial weights per seed): mean ± 95% CI, n "
    f"pairs, paired t-test p, Wilcoxon signed-rank p from {WILCOXON_MIN_PAIRS} pairs. "
    "win / loss: p < 0.05 on at least 3 pairs, in the metric's better direction (↑ higher, "
    "↓ lower is better); tie: no significant difference; n < 3: too few pairs to say; "
    "unequal budget: the two rows trained for different steps, batch sizes or training "
    "sets, so no verdict. finished: seeds that ended ok / seeds run; a capped, diverged or "
    "failed seed is a failure of that model, never averaged.")
#: How to read the expectations.
EXPECTATION_NOTE = (
    "Each claim is judged on model − control per finished seed (against a number: the "
    "one-sample test): confirmed or contradicted only with at least 3 paired seeds and "
    "p < 0.05; otherwise insufficient evidence, with the reason. A claim on an "
    "out-of-distribution split is judged only if the model first reached the stated test "
    "metric on every finished seed.")


def comparison_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task × model with a baseline: the paired difference and its mark."""
    head = ["task", "model", "baseline", "finished", "Δ test (model − baseline)", "n",
            "p (paired t)", "p (Wilcoxon)", "verdict"]
    rows = [[f"{c.task} ({c.metric} {_direction(c.higher_is_better)})", c.model, c.baseline,
             _finished(c.finished, c.run), signed(c.paired), str(c.paired.n), _p(c.paired.p),
             _p(c.paired.wilcoxon), c.mark]
            for c in report.comparisons]
    return head, rows


def table_cells(table: TaskTable) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one task's table, shared by the text and HTML renderers."""
    arrow = _direction(table.higher_is_better)
    head = ["model", "n", f"test {arrow}", "test per seed",
            *([f"val {arrow}"] if table.has_val else []), f"train {arrow}",
            *(f"{s} {arrow}" for s in table.ood_splits), *table.extras,
            "params (× baseline)", "FLOPs/sample", "NFE fwd/bwd", "time (s)", "status"]
    rows = []
    for r in table.rows:
        nfe = ("—" if r.nfe_forward is None
               else f"{_num(r.nfe_forward, 3)}/{_num(r.nfe_backward, 3)}")
        params = _num(r.params, 6)
        if r.params_ratio is not None:
            params += f" ({r.params_ratio:.2f}×)"
        rows.append([r.model + (" ⚑" if r.flagged else ""), _finished(r.finished, r.run),
                     _est(r.test), _per_seed(r.per_seed), *([_est(r.val)] if table.has_val else []),
                     _est(r.train), *(_est(r.ood[s]) for s in table.ood_splits),
                     *(_est(r.extra[e]) for e in table.extras),
                     params, _num(r.flops, 3), nfe, _num(r.wall_time, 3), _status(r.statuses)])
    return head, rows


def flag_notes(table: TaskTable) -> list[str]:
    """One line per flagged model: the seeds whose ODE solve failed its reconstruction check."""
    return [f"⚑ {r.model}: on seed(s) {', '.join(map(str, r.flagged))} the ODE reconstruction "
            "error (0 → T → 0) exceeded its tolerance: the solver, not only the model, shaped "
            "the result" for r in table.rows if r.flagged]


def expectation_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per task expectation: claim, reason, n, difference, p, verdict and why."""
    head = ["task", "claim", "reason", "model / control", "n", "Δ (model − control)", "p",
            "verdict", "note"]
    rows = []
    for v in report.expectations:
        p = v.paired
        matched = " / ".join(label for label in (v.model, v.control) if label) or "—"
        rows.append([f"{v.task} ({_direction(v.higher_is_better)})", v.claim,
                     v.expectation.reason, matched, "—" if p is None else str(p.n),
                     "—" if p is None else signed(p), "—" if p is None else _p(p.p),
                     v.verdict, v.note or "—"])
    return head, rows


#: What the regime audit pools, said once for every renderer.
REGIME_NOTE = ("Share of (sample, layer) gates per regime on the test split, pooled over seeds, "
               "for the stacks with the erase term, `ddl` and `ddl-transformer` (for a "
               "Transformer a sample is a token and a layer a sublayer); the write-only "
               "controls are left out, their β only scales a write.")


#: How to read the crossover tables.
CROSSOVER_NOTE = (
    "Where the run sweeps a task's knob (e.g. the event rate p), each model against its "
    "baseline and ddl against ddl-write at every knob value: model − control per seed, mean ± "
    "95% CI over the seeds both finished, and the verdict mark as above. The crossover p* is "
    "the smallest knob value from which on the model wins at every larger value in the run; "
    "none in range: it does not win at the largest.")


def crossover_cells(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per swept task family: a title, a header and one row per setting × model × control
    with ``p*`` and the paired difference at every knob value."""
    tables = []
    for family in dict.fromkeys(c.setting.family for c in report.crossovers):
        found = [c for c in report.crossovers if c.setting.family == family]
        first = found[0]
        values = sorted({v for c in found for v, _ in c.points})
        head = ["setting", "model − control", "crossover",
                *(f"{first.setting.knob} = {v:g}" for v in values)]
        rows = []
        for c in found:
            at = dict(c.points)
            rows.append([c.setting.label or "—", f"{c.model} − {c.control}",
                         star_text(c.star, c.setting.knob),
                         *(f"{signed(at[v])} ({MARKS[at[v].outcome(c.higher_is_better)]})"
                           if v in at else "—" for v in values)])
        title = (f"{family}: test {first.metric} {_direction(first.higher_is_better)} "
                 f"against {first.setting.knob}")
        tables.append((title, head, rows))
    return tables


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
    """The report as GitHub-flavoured markdown, verdicts first."""
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
    lines += ["", "## Verdicts against each model's baseline", "", COMPARISON_NOTE, ""]
    lines += [*_md_table(*comparison_cells(report)), ""]
    if report.expectations:
        lines += ["## Expectations against the measured seeds", "", EXPECTATION_NOTE, ""]
        lines += [*_md_table(*expectation_cells(report)), ""]
    if report.crossovers:
        lines += ["## Crossover", "", CROSSOVER_NOTE, ""]
        for title, head, rows in crossover_cells(report):
            lines += [f"### {title}", "", *_md_table(head, rows), ""]
    lines += ["## Results per task", "",
              "n: seeds that finished / seeds run; mean ± 95% CI over the finished seeds (a "
              "bare mean: one seed), every seed's value beside it; ↑/↓: higher/lower is "
              "better; params × baseline: the ratio to the baseline's parameter count.", ""]
    for table in report.tables:
        lines += [f"### {table.task} — {table.metric} {_direction(table.higher_is_better)}", ""]
        lines += _md_table(*table_cells(table))
        lines += [f"\n{note}" for note in flag_notes(table)]
        if table.problems:
            lines += ["", "Cells that did not finish cleanly, and splits not run:", ""]
            lines += [f"- {who(p, lambda m: f'`{m}`')}: **{p.status}** — {_md_escape(p.message)}"
                      for p in table.problems]
        lines.append("")
    if report.regimes:
        lines += ["## Gate regimes used by the trained Delta stacks (test split)", "",
                  REGIME_NOTE, ""]
        lines += [*_md_table(*regime_cells(report)), ""]
    return "\n".join(lines)


def _flat_rows(report: Report) -> list[dict[str, Any]]:
    """One flat dict per task × model, the shape of the CSV: the verdict columns first."""
    def verdict(c: Comparison | None) -> dict[str, Any]:
        p = c.paired if c else Paired((), (), None, None, None, None)
        return {"verdict": c.mark if c else None, "diff_mean": p.mean, "diff_ci": p.ci,
                "n_paired": p.n if c else None, "p_paired_t": p.p, "p_wilcoxon": p.wilcoxon}

    versus = {(c.task, c.model): c for c in report.comparisons}
    out = []
    for table in report.tables:
        for r in table.rows:
            row: dict[str, Any] = {
                "task": table.task, "model": r.model, "metric": table.metric,
                "higher_is_better": table.higher_is_better, "baseline": r.baseline,
                **verdict(versus.get((table.task, r.model))), "finished": r.finished,
                "run": r.run,
                **{s: r.statuses.get(s, 0) for s in STATUSES},
                "test_mean": r.test.mean, "test_ci": r.test.ci,
                "test_per_seed": "; ".join(f"{seed}: {v}" for seed, v in
                                           sorted(r.per_seed.items())),
                "val_mean": r.val.mean, "val_ci": r.val.ci,
                "train_mean": r.train.mean, "train_ci": r.train.ci,
                "params": r.params, "params_ratio": r.params_ratio, "flops": r.flops,
                "nfe_forward": r.nfe_forward, "nfe_backward": r.nfe_backward,
                "wall_time": r.wall_time, "reconstruction_flagged_seeds": " ".join(
                    map(str, r.flagged)),
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
