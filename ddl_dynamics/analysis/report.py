"""The report: the verdicts first, then the evidence they rest on.

:func:`build_report` reads a run folder once (:func:`~.run.load_run`) and turns it into

- **comparisons**: per task, every row against its baseline (the label its cells name in
  ``config["baseline"]``) and every comparison the experiment declares
  (``[[comparisons]]``), each drawn and labelled by the rule book (:mod:`.verdicts`):
  win / loss / equivalent / inconclusive on Holm-adjusted p-values over every test of the
  report, or no test (unequal budget, unmatched size) with the reason;
- **expectations**: the tasks' claims, judged as comparisons of the same family
  (:mod:`.expectations`);
- **crossovers**: the comparisons followed across a swept knob (:mod:`.crossover`);
- **tables**: per task, one row per model at its chosen grid value: n = finished seeds /
  seeds run, the per-seed test values beside their mean ± 95% CI, the chosen value, params
  and their ratio to the baseline's, and the ODE reconstruction flag; every failed seed and
  every earlier attempt listed;
- **regimes**: the gate regimes the trained Delta stacks use.

Renderers in :data:`RENDERERS` turn a report into text (``md``, ``csv``, ``json``), each
opening with the comparisons.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._task import make_task
from ..experiment.config import COUNTED
from ..experiment.folder import RunFolder
from ..experiment.store import STATUSES, RunResult
from ..models.operator import REGIMES
from .comparisons import Comparison, Request, judge
from .crossover import Crossover, crossovers, interval_text, star_text
from .expectations import Verdict, expectation_requests, judge_expectations
from .probes import erases, load_probes, probe_run, usable_rows
from .regimes import regime_fractions
from .results import load_results, results_csv
from .run import Row, Run, in_tasks, load_run
from .stats import ALPHA, PAIRED_T, POWER, Estimate, Paired
from .verdicts import EQUIVALENT, FAILS, INCONCLUSIVE, LOSS, MIN_PAIRS, SIZE_TOLERANCE, WIN, flagged
from .wording import counts, counts_text, difference, sentence


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
    task's knob is swept), tables, regimes. ``tests`` is the size of the family of p-values
    Holm adjusts over."""

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

    @property
    def statuses(self) -> Counter[str]:
        """The statuses of the cells the tables show."""
        return sum((Counter(r.statuses) for t in self.tables for r in t.rows), Counter())

    @property
    def cells_text(self) -> str:
        """``"24 ok"``, or ``"24 ok at the chosen grid values, of 72 trained"``, then how far
        an unfinished run got."""
        shown = _status(self.statuses) or "none"
        count = sum(self.statuses.values())
        text = shown if self.trained == count else (
            f"{shown} at the chosen grid values, of {self.trained} trained")
        return f"{text} ({self.progress})" if self.progress else text


def build_report(run: Run | RunFolder | str | Path) -> Report:
    """Aggregate a run folder (open, or a path), or a run read once: comparisons,
    expectations, crossovers, tables, regimes."""
    run = run if isinstance(run, Run) else load_run(run)
    requests = _requests(run)
    pending = expectation_requests(run)
    judged = judge(run, [*requests, *(r for _, _, r in pending if isinstance(r, Request))])
    higher = {task: next(iter(run.task_rows(task).values())).higher_is_better
              for task in run.tasks}
    comparisons = [judged[r.key] for r in requests]
    drawn = {(c.task, frozenset((c.model, c.control_text)), c.split)  # a mirror is one test
             for c in judged.values() if c.p_adjusted is not None}
    name = run.experiment.get("name") or run.run_dir.name
    return Report(name, str(run.run_dir), run.experiment, comparisons,
                  judge_expectations(pending, judged, higher),
                  [_table(run, task) for task in run.tasks],
                  _regimes(run), crossovers(run, comparisons), len(drawn),
                  sum(len(row.cells) for row in run.rows.values()),
                  _unfinished(run), _description(run))


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
        requests += [Request(task, label, baseline, "baseline") for label in sorted(rows)
                     if (baseline := run.baseline(task, label)) in rows]
        requests += [Request(task, c.model, c.control, "declared", c.split, c.requires)
                     for c in run.comparisons
                     if c.model in rows and c.control in rows and in_tasks(task, c.tasks)]
    return list({r.key: r for r in requests}.values())


def _regimes(run: Run) -> list[RegimeRow]:
    """Gate-regime use of every shown Delta stack with the erase term and stored weights,
    pooled over seeds: the report probes those it shows that are not probed yet, so the
    table never depends on which probes happen to be kept."""
    betas: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    stated: dict[str, tuple[str, ...]] = {}
    if run.folder is not None:
        probe_run(run, progress=False, rows=[r for r in usable_rows(run) if erases(r)])
    for row, arrays in load_probes(run):
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


def _table(run: Run, task: str) -> TaskTable:
    models = run.task_rows(task)
    every = [c for row in models.values() for c in row.selected]
    described = next(iter(models.values())).described
    splits = sorted({s for r in every for s in r.metrics.get("ood", {})})
    extras = sorted({e for r in every for e in _extras(r)},
                    key=lambda e: (e in _ODE_EXTRAS.values(), e))
    baselines = {label: run.baseline(task, label) for label in models}
    order = sorted(models, key=lambda m: (m not in baselines.values(), m))
    rows, problems = [], []
    skipped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for model in order:
        row = models[model]
        group = row.selected
        ok = [r for r in group if r.status in COUNTED]
        params = Estimate.of([r.params for r in group]).mean
        base = models.get(baselines[model] or "")
        reference = Estimate.of([r.params for r in base.selected] if base else []).mean
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
            flagged=flagged(ok),
            chosen=row.chosen_text(),
            retries=len(row.attempts),
            older=row.older,
        ))
        for r in group:
            if r.status not in COUNTED:
                problems.append(Problem(model, r.seed, r.status, r.message))
            for split, reason in r.metrics.get("skipped", {}).items():
                if model not in skipped[split, reason]:
                    skipped[split, reason].append(model)
        problems += [Problem(model, a.seed, f"{a.status}, then retried",
                             f"{_attempt_at(row, a)}{a.message or 'no message'} "
                             f"(attempt of {a.created_at})") for a in row.attempts]
        if row.ensembles:
            problems.append(Problem(model, None, "seeds trained in different ensembles",
                                    f"in {len(row.ensembles)} ensembles of "
                                    f"{', '.join(map(str, row.ensembles))} cells (a resumed "
                                    "run, or --seeds or --no-vectorize between runs): their "
                                    "last bits differ by the float rounding of folding"))
        if row.older:
            problems.append(Problem(model, None, "older config left out",
                                    f"{row.older} cell(s) of an earlier version of this row's "
                                    "config are in the store but not in this report"))
    problems += [Problem(", ".join(labels), None, f"{split} not run", reason)
                 for (split, reason), labels in skipped.items()]
    return TaskTable(task, described.get("metric", "metric"),
                     bool(described.get("higher_is_better", False)), splits, extras, rows,
                     problems)


def _attempt_at(row: Row, attempt: RunResult) -> str:
    """``"at lr=0.01: "`` for an attempt of a tuned row, else empty."""
    train = attempt.config.get("train", {})
    values = ", ".join(f"{f}={train.get(f):g}" if isinstance(train.get(f), float)
                       else f"{f}={train.get(f)}" for f in row.grid)
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


# --- renderers

def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _est(e: Estimate) -> str:
    if e.mean is None:
        return "—"
    return _num(e.mean) if e.ci is None else f"{_num(e.mean)} ± {_num(e.ci, 2)}"


def signed(p: Paired) -> str:
    """A paired mean difference, signed, with its CI half-width: ``"-0.41 ± 0.12"``."""
    return difference(p.mean, p.ci)


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
    "Each row against its baseline, and each comparison the experiment declares: model − "
    "control per seed (same data and initial weights per seed), each row at its own grid "
    "value chosen on val. Δ: mean ± 95% CI over the seeds both finished; n: seeds both "
    "finished (of the seeds compared, where one failed: a seed one side did not finish, or "
    "whose metric is not finite, counts as that side's worst outcome). p: the paired t-test "
    "of the mean difference (t; differences that do not vary give p = 0, or 1 where they "
    "are 0; rank: the exact signed-rank test, where a seed failed), then Holm-adjusted over "
    "every test of this report that could reach the level, a mirrored pair counted once; "
    "the paired-t TOST p of equivalence at the task's margin, raw and adjusted, with its "
    "90% t interval. win / "
    f"loss: adjusted p < {ALPHA}, in the metric's better / worse direction (↑ higher, ↓ lower "
    f"is better); equivalent: otherwise, adjusted TOST p < {ALPHA} (the 90% interval inside "
    "the margin); both solved: both rows at the metric's best value on every seed, no test; "
    f"fails k/n: fewer than {MIN_PAIRS} seeds both finished because a side failed; "
    f"inconclusive: neither, or fewer than {MIN_PAIRS} seeds, with the smallest difference "
    f"the test could have detected ({POWER:.0%} power, at the Bonferroni level); not "
    "significant is never equal. unequal tuning: the rows searched different grids; "
    "unequal budget: the training configs differ beyond seed and tuned fields, or a seed "
    f"stopped early; unmatched size: parameter counts more than {SIZE_TOLERANCE:.0%} apart: "
    "no test. At every grid value: whether the model's side of the difference holds with "
    "both rows at each value of the grid.")
#: How to read the expectations.
EXPECTATION_NOTE = (
    "Each claim is a comparison of the report, drawn and Holm-adjusted with the others: "
    "confirmed by a win (a claim of better) or a loss (worse), contradicted by the opposite "
    "label or by equivalence within the task's margin, otherwise insufficient evidence, "
    "with the reason. Against a number, the one-sample test. A claim on an "
    "out-of-distribution split is judged only where its rows first reached the stated test "
    "metric on every seed.")


def _test(paired: Paired) -> str:
    return "t" if paired.test == PAIRED_T else "rank"


def _n(p: Paired) -> str:
    """``n = 8``: the pairs both rows finished, ``n = 3 of 5`` where seeds failed."""
    return f"n = {p.n}" if p.n == p.total else f"n = {p.n} of {p.total}"


def _verdict(c: Comparison) -> str:
    """The label, with n and what an inconclusive test could have detected."""
    p = c.paired
    if p is None:
        return c.label
    if c.label == FAILS:
        sides = [f"{row} {FAILS} {len(failed) + len(p.both_failed)}/{p.total}"
                 for row, failed in ((c.model, p.failed), (c.control_text, p.control_failed))
                 if failed or p.both_failed]
        return "; ".join(sides)
    if c.label == INCONCLUSIVE:
        if c.detectable is not None:
            seen = f"; detectable ±{_num(c.detectable, 2)}"
        elif p.differences and not any(p.differences) and p.n == p.total:
            seen = "; identical on every seed"
        elif p.n >= MIN_PAIRS and p.floor >= ALPHA:
            seen = f"; p cannot fall below {_p(p.floor)} at this n"
        else:
            seen = ""
        return f"inconclusive ({_n(p)}{seen})"
    return f"{c.label} ({_n(p)})"


def _tost(c: Comparison) -> str:
    """The TOST's raw p, its Holm-adjusted p, the margin and the 90% interval."""
    p = c.paired
    if p is None or p.margin is None or p.tost is None:
        return "—"
    low, high = p.interval or (None, None)
    return (f"{_p(p.tost)} → {_p(c.tost_adjusted)} (±{_num(p.margin, 2)}; 90% "
            f"[{_num(low, 2) if low is not None and math.isfinite(low) else '−∞'}, "
            f"{_num(high, 2) if high is not None and math.isfinite(high) else '∞'}])")


def _grid(c: Comparison) -> str:
    """``"holds (3/3)"``, or the grid values where the model's side flips or evens out."""
    holds = c.grid_holds
    if holds is None:
        return "—"
    if holds:
        return f"holds ({len(c.grid)}/{len(c.grid)})"
    overall = c.paired.better(c.higher_is_better) if c.paired else None
    flips = [text for text, sign in c.grid if sign is not None and sign != overall]
    even = [text for text, sign in c.grid if sign is None]
    return "; ".join(part for part in (flips and "flips at " + ", ".join(flips),
                                       even and "no difference at " + ", ".join(even)) if part)


def comparison_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per comparison: the paired difference, its tests and its label."""
    head = ["task", "model", "control", "chosen", "Δ (model − control)", "p", "p Holm",
            "TOST p → Holm (margin; 90% interval)", "verdict", "at every grid value",
            "note"]
    rows = []
    for c in report.comparisons:
        p = c.paired
        split = "" if c.split == "test" else f", {c.split}"
        chosen = " / ".join(t or "—" for t in (c.chosen, c.control_chosen))
        rows.append([
            f"{c.task} ({c.metric} {_direction(c.higher_is_better)}{split})", c.model,
            c.control_text, chosen if chosen != "— / —" else "—",
            "—" if p is None else signed(p),
            "—" if p is None or p.p is None else f"{_p(p.p)} ({_test(p)})",
            _p(c.p_adjusted),
            _tost(c),
            _verdict(c), _grid(c), c.note or "—"])
    return head, rows


def table_cells(table: TaskTable) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one task's table, shared by the text and HTML renderers."""
    arrow = _direction(table.higher_is_better)
    head = ["model", "n", *(["chosen"] if table.tuned else []), f"test {arrow}", "test per seed",
            *([f"val {arrow}"] if table.has_val else []), f"train {arrow}",
            *(f"{s} {arrow}" for s in table.ood_splits), *table.extras,
            "params (× baseline)", "matmul FLOPs/sample", "NFE fwd/bwd", "time (s)", "status"]
    rows = []
    for r in table.rows:
        nfe = ("—" if r.nfe_forward is None
               else f"{_num(r.nfe_forward, 3)}/{_num(r.nfe_backward, 3)}")
        params = _num(r.params, 6)
        if r.params_ratio is not None:
            params += f" ({r.params_ratio:.2f}×)"
        n = _finished(r.finished, r.run) + (f", {r.retries} retried" if r.retries else "")
        rows.append([r.model + (" ⚑" if r.flagged else ""), n,
                     *([r.chosen or "—"] if table.tuned else []), _est(r.test),
                     _per_seed(r.per_seed), *([_est(r.val)] if table.has_val else []),
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
    head = ["task", "claim", "reason", "model / control", "n", "Δ (model − control)",
            "p Holm", "verdict", "note"]
    rows = []
    for v in report.expectations:
        p = v.comparison.paired if v.comparison else None
        matched = " / ".join(label for label in (v.model, v.control) if label) or "—"
        rows.append([f"{v.task} ({_direction(v.higher_is_better)})", v.claim,
                     v.expectation.reason, matched, "—" if p is None else _n(p),
                     "—" if p is None else signed(p),
                     "—" if v.comparison is None else _p(v.comparison.p_adjusted),
                     v.verdict, v.note or "—"])
    return head, rows


#: What the regime audit pools, said once for every renderer.
REGIME_NOTE = ("Share of (sample, layer) gates per regime on the test split, pooled over seeds, "
               "for the stacks with the erase term, `ddl` and `ddl-transformer` (for a "
               "Transformer a sample is a token and a layer a sublayer); the write-only "
               "controls are left out, their β only scales a write.")


#: How to read the crossover tables.
CROSSOVER_NOTE = (
    "Where the run sweeps a task's knob (e.g. the event rate p), every comparison above "
    "followed across the knob: at each value the paired difference (mean ± 95% CI over the "
    "seeds both finished) and its adjusted label with n. The crossover p* is the smallest "
    "knob value from which on the model wins at every larger value in the run (none in "
    "range: it does not win at the largest); it reads adjusted verdicts, so one point that "
    "misses significance moves it. Beside it, the 95% bootstrap interval over seeds of the "
    "knob value from which on the mean difference favours the model (none: beyond the "
    "range).")


def crossover_cells(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per swept task family: a title, a header and one row per setting × model × control
    with ``p*`` and the judged comparison at every knob value."""
    tables = []
    for family in dict.fromkeys(c.setting.family for c in report.crossovers):
        found = [c for c in report.crossovers if c.setting.family == family]
        first = found[0]
        values = sorted({v for c in found for v, _ in c.points})
        head = ["setting", "model − control", "crossover", "sign crossover (bootstrap)",
                *(f"{first.setting.knob} = {v:g}" for v in values)]
        rows = []
        for c in found:
            at = dict(c.points)
            rows.append([c.setting.label or "—", f"{c.model} − {c.control}",
                         star_text(c.star, c.setting.knob), interval_text(c.interval),
                         *(_point(at[v]) if v in at else "—" for v in values)])
        title = (f"{family}: test {first.metric} {_direction(first.higher_is_better)} "
                 f"against {first.setting.knob}")
        tables.append((title, head, rows))
    return tables


def _point(c: Comparison) -> str:
    return c.label if c.paired is None else f"{signed(c.paired)} ({_verdict(c)})"


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


#: Where no row searched a grid.
UNTUNED_NOTE = ("No row was tuned: every row trained at the rates the experiment fixed, not "
                "each at its own best, so a verdict here may change at another rate.")


def untuned(report: Report) -> bool:
    """Whether no row of the report searched a grid: its verdicts rest on fixed rates."""
    return bool(report.tables) and not any(r.chosen for t in report.tables for r in t.rows)


#: How to read the tables per task.
TABLE_NOTE = (
    "Each row at its chosen grid value (chosen: the value with the best mean val metric). n: "
    "seeds that finished / seeds run (retried: earlier attempts, listed below the table); "
    "mean ± 95% CI over the finished seeds (a bare mean: one seed), every seed's value "
    "beside it; ↑/↓: higher/lower is better; params × baseline: the ratio to the baseline's "
    "parameter count; matmul FLOPs/sample: forward FLOPs of matmuls, convolutions and "
    "attention as torch's FLOP counter counts them (elementwise work, the Delta update's "
    "included, is not counted), per sample of one val batch.")


def matrix_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """The verdict matrix as a table: one row per task, one column per model, each cell the
    label of the model against its baseline (blank: the baseline itself, or not run)."""
    against = [c for c in report.comparisons if "baseline" in c.kinds]
    models = list(dict.fromkeys(c.model for c in against))
    labels = {(c.task, c.model): c.label for c in against}
    tasks = list(dict.fromkeys(c.task for c in against))
    return (["task", *models],
            [[task, *(labels.get((task, m), "") for m in models)] for task in tasks])


def summary_lines(report: Report) -> list[str]:
    """The results in words: one sentence per comparison decided (win, loss, equivalent) or
    declared, then how many others are inconclusive or untested."""
    stated = [c for c in report.comparisons
              if "declared" in c.kinds or c.label in (WIN, LOSS, EQUIVALENT)]
    rest = [c for c in report.comparisons if c not in stated]
    lines = [sentence(c) for c in stated]
    if rest:
        lines.append(f"The other {len(rest)} comparisons: {counts_text(counts(rest))}; see "
                     "the table below.")
    return lines


def lead_text(report: Report) -> str:
    """What kind of run it is, from the experiment's description."""
    return report.description or "The experiment file gives no description of this run."


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured markdown: what the run is, a summary (labels, matrix,
    results in words), then the long tables."""
    exp = report.experiment
    versions = exp.get("versions", {})
    machine = exp.get("machine", {})
    lines = [f"# Experiment `{report.name}`", "", lead_text(report), ""]
    lines.append(f"Run folder `{report.run_dir}`; cells: {report.cells_text}.")
    if versions:
        lines.append("Software: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    if machine:
        lines.append(f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} CPUs"
                     + (f", {machine['cuda']}" if "cuda" in machine else "") + ".")
    lines += ["", "## Summary", "",
              f"{len(report.comparisons)} comparisons, {report.tests} tests: "
              f"{counts_text(counts(report.comparisons)) or 'none'}.",
              *(["", f"**{UNTUNED_NOTE}**"] if untuned(report) else []), ""]
    head, rows = matrix_cells(report)
    if rows:
        lines += ["Each model against its baseline:", "", *_md_table(head, rows), ""]
    lines += [f"- {line}" for line in summary_lines(report)]
    lines += ["", "## Verdicts", "", COMPARISON_NOTE,
              f"This report draws {report.tests} tests.", ""]
    lines += [*_md_table(*comparison_cells(report)), ""]
    if report.expectations:
        lines += ["## Expectations against the measured seeds", "", EXPECTATION_NOTE, ""]
        lines += [*_md_table(*expectation_cells(report)), ""]
    if report.crossovers:
        lines += ["## Crossover", "", CROSSOVER_NOTE, ""]
        for title, head, rows in crossover_cells(report):
            lines += [f"### {title}", "", *_md_table(head, rows), ""]
    lines += ["## Results per task", "",
              TABLE_NOTE, ""]
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


def render_csv(report: Report) -> str:
    """The run's tidy table, one line per cell (:func:`~.results.load_results`)."""
    return results_csv(load_results(report.run_dir))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def render_json(report: Report) -> str:
    """The report's dataclasses as JSON, each expectation with its claim in words."""
    data = dataclasses.asdict(report)
    for record, verdict in zip(data["expectations"], report.expectations, strict=True):
        record["claim"] = verdict.claim
    return json.dumps(_json_safe(data), indent=1, ensure_ascii=False)


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
