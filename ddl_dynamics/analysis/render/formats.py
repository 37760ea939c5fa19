"""The report as text: renderers in `RENDERERS` turn a `Report` into
``md``, ``csv`` or ``json``, each opening with the comparisons; `write_report` writes
one for a run folder."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..report.build import Report, TaskTable, build_report
from ..report.text import (
    COMPARISON_NOTE,
    CROSSOVER_NOTE,
    EXPECTATION_NOTE,
    MIXING_NOTE,
    REGIME_NOTE,
    TABLE_NOTE,
    UNTUNED_NOTE,
    comparison_cells,
    crossover_cells,
    expectation_cells,
    flag_notes,
    lead_text,
    matrix_cells,
    mixing_cells,
    regime_cells,
    summary_lines,
    table_cells,
    untuned,
    who,
)
from ..report.wording import counts, counts_text, metric_title
from ..results import load_results, results_csv


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]


def _md_head(report: Report) -> list[str]:
    """The title, the lead, and where and on what the run ran."""
    versions = report.experiment.get("versions", {})
    machine = report.experiment.get("machine", {})
    lines = [f"# Experiment `{report.name}`", "", lead_text(report), ""]
    lines.append(f"Run folder `{report.run_dir}`; cells: {report.cells_text}.")
    if versions:
        lines.append("Software: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    if machine:
        lines.append(
            f"Machine: {machine.get('platform')}, {machine.get('cpu_count')} CPUs"
            + (f", {machine['cuda']}" if "cuda" in machine else "")
            + "."
        )
    return lines


def _md_results(table: TaskTable) -> list[str]:
    """One task's results table, its flags and the cells that did not finish cleanly."""
    title = metric_title(table.task, table.metric, table.higher_is_better, table.floor)
    lines = [f"### {title}", ""]
    lines += _md_table(*table_cells(table))
    lines += [f"\n{note}" for note in flag_notes(table)]
    if table.problems:
        lines += ["", "Cells that did not finish cleanly, and splits not run:", ""]
        lines += [
            f"- {who(p, lambda m: f'`{m}`')}: **{p.status}** — {_md_escape(p.message)}"
            for p in table.problems
        ]
    return [*lines, ""]


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured markdown: what the run is, a summary (labels, matrix,
    results in words), then the long tables."""
    lines = _md_head(report)
    lines += [
        "",
        "## Summary",
        "",
        f"{len(report.comparisons)} comparisons, {report.tests} tests: "
        f"{counts_text(counts(report.comparisons)) or 'none'}.",
        *(["", f"**{UNTUNED_NOTE}**"] if untuned(report) else []),
        "",
    ]
    head, rows = matrix_cells(report)
    if rows:
        lines += ["Each model against its baseline:", "", *_md_table(head, rows), ""]
    lines += [f"- {line}" for line in summary_lines(report)]
    lines += [
        "",
        "## Verdicts",
        "",
        COMPARISON_NOTE,
        f"This report draws {report.tests} tests.",
        "",
    ]
    lines += [*_md_table(*comparison_cells(report)), ""]
    if report.expectations:
        lines += ["## Expectations against the measured seeds", "", EXPECTATION_NOTE, ""]
        lines += [*_md_table(*expectation_cells(report)), ""]
    if report.crossovers:
        lines += ["## Crossover", "", CROSSOVER_NOTE, ""]
        for title, head, rows in crossover_cells(report):
            lines += [f"### {title}", "", *_md_table(head, rows), ""]
    lines += ["## Results per task", "", TABLE_NOTE, ""]
    for table in report.tables:
        lines += _md_results(table)
    if report.regimes:
        lines += [
            "## Gate regimes used by the trained Delta stacks (test split)",
            "",
            REGIME_NOTE,
            "",
        ]
        lines += [*_md_table(*regime_cells(report)), ""]
    if report.mixing:
        lines += [
            "## Stream mixing of the trained Hyper-Connections stacks",
            "",
            MIXING_NOTE,
            "",
            *_md_table(*mixing_cells(report.mixing)),
            "",
        ]
    return "\n".join(lines)


def render_csv(report: Report) -> str:
    """The run's tidy table, one line per cell (`load_results`)."""
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
    """The report in format ``fmt``, a key of `RENDERERS`."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown report format {fmt!r}; formats: {', '.join(RENDERERS)}")
    return RENDERERS[fmt](report)


def write_report(run_dir: str | Path, fmt: str = "md", path: str | Path | None = None) -> Path:
    """Render a run folder's report to ``path`` (default ``<run_dir>/report.<fmt>``)."""
    text = render(build_report(run_dir), fmt)
    path = Path(path) if path is not None else Path(run_dir) / f"report.{fmt}"
    path.write_text(text)
    return path
