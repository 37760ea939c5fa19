"""A study's reference results, shipped as data: ``results/<study>/`` from a run folder.

A published study holds everything the documentation quotes and nothing a reader cannot
check: ``cells.csv`` (every cell, the data the report judges) and ``record.json`` (what the run
recorded beside them; `study`), ``report.json`` (the report judged from them,
`render_json`), ``experiment.toml`` (the
file as it ran), ``run.json`` (what ran it: command, versions, machine, wall time, dates)
and ``figures/*.png`` (the verdict matrix and the per-seed comparison drawn now, from the
report, plus every other figure already in the run folder's ``figures/``: run ``ddl-dyn plot
all RUN_DIR`` first for curves, regimes and the rest). No weights, no store: ``ddl-dyn
docs`` and ``ddl-dyn compare`` read these files alone. The run folder is only read, but
for the probes its report computes (`build_report`), kept in ``probes/``.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .figures import compare_figures, run_colors
from .render import render_json
from .report import Report, build_report
from .run import Run, load_run
from .study import REPORT, shipped, study_report, write_study_data

#: The files of a published study (beside its report and cells, `study`).
EXPERIMENT, RUN, FIGURES = "experiment.toml", "run.json", "figures"
#: The one hand-written file of a published study: which labels a rerun changed against its
#: earlier runs, named in words (the numbers stay in the report). Publishing again keeps it.
CHANGES = "changes.md"


def publish(run_dir: str | Path, results: str | Path = "results", name: str | None = None,
            command: str | None = None) -> Path:
    """Write ``results/<name>/`` from a finished run folder (``name``: the experiment's)."""
    run = load_run(run_dir)
    if not run.rows:
        raise ValueError(f"{run_dir}: no results to publish")
    report = build_report(run)
    name = name or report.name
    report = replace(report, run_dir=f"runs/{name}")  # where a rerun puts it, not this machine's
    out = Path(results) / name
    changes = (out / CHANGES).read_text() if (out / CHANGES).is_file() else None
    if out.exists():
        shutil.rmtree(out)  # a study is published whole: no figure of an older run stays
    (out / FIGURES).mkdir(parents=True)
    if changes is not None:
        (out / CHANGES).write_text(changes)
    write_study_data(run, report, out)
    report = study_report(out)  # judged from the shipped cells, as every later read is
    (out / REPORT).write_text(render_json(report) + "\n")
    (out / EXPERIMENT).write_text(run.experiment.get("config", ""))
    (out / RUN).write_text(json.dumps(provenance(run, name, command), indent=1) + "\n")
    drawn = {p.name for p in _draw(run, report, out)}
    kept = Path(run_dir) / FIGURES
    for png in sorted(kept.glob("*.png")) if kept.is_dir() else ():
        if png.name not in drawn:
            shutil.copyfile(png, out / FIGURES / png.name)
    return out


def _draw(run: Run, report: Report, out: Path) -> list[Path]:
    """The figures drawn from the report alone, into ``out/figures`` (the run folder
    untouched); PNG only."""
    drawn = compare_figures(replace(run, run_dir=out), report, run_colors(run))
    for path in drawn:
        if path.suffix != ".png":
            path.unlink()
    return [p for p in drawn if p.suffix == ".png"]


def provenance(run: Run, name: str, command: str | None = None) -> dict[str, Any]:
    """What ran a study: the command, software, machine, dates and the time it took (the
    latest run's span and the cells' summed training time)."""
    exp = run.experiment
    started, ended = exp.get("started_at"), exp.get("ended_at")
    span = None
    if started and ended:
        span = (datetime.fromisoformat(ended) - datetime.fromisoformat(started)).total_seconds()
    cells = [c for row in run.rows.values() for c in row.cells]
    return {
        "study": name,
        "command": command or f"ddl-dyn run experiments/{name}.toml",
        "versions": exp.get("versions", {}),
        "machine": exp.get("machine", {}),
        "started_at": started,
        "ended_at": ended,
        "wall_time_s": span,
        "cell_time_s": sum(c.wall_time or 0.0 for c in cells),
        "cells": len(cells),
    }


def load_study(folder: str | Path) -> dict[str, Any]:
    """A published study's report (``report.json``) as a dict, its ``run.json`` under
    ``"run"``; a folder that is not a published study raises ValueError."""
    folder = Path(folder)
    path = folder / REPORT
    if not path.is_file() and not shipped(folder):
        raise ValueError(f"{folder}: not a published study (no {REPORT}; make one with "
                         "ddl-dyn publish RUN_DIR)")
    try:
        report = json.loads(render_json(study_report(folder)) if shipped(folder)
                            else path.read_text())
        run = json.loads((folder / RUN).read_text()) if (folder / RUN).is_file() else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(report, dict) or "comparisons" not in report:
        raise ValueError(f"{path}: not a report (no comparisons)")
    changes = (folder / CHANGES).read_text() if (folder / CHANGES).is_file() else ""
    return {**report, "run": run, "questions": questions(folder / EXPERIMENT), "changes": changes}


def questions(experiment: Path) -> list[dict[str, Any]]:
    """The declared comparisons of a study's experiment file that state a ``question``, as
    dicts (``question``, ``model``, ``control``, ``tasks``, ``split``); none where the file
    is missing or states none."""
    if not experiment.is_file():
        return []
    try:
        data = tomllib.loads(experiment.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{experiment}: malformed TOML ({err})") from None
    return [{"question": c["question"], "model": c["model"], "control": c["control"],
             "tasks": list(c.get("tasks", [])), "split": c.get("split", "test")}
            for c in data.get("comparisons", []) if isinstance(c, dict) and c.get("question")]


def studies(results: str | Path = "results") -> list[Path]:
    """The published study folders under ``results``, by name."""
    root = Path(results)
    if not root.is_dir():
        raise ValueError(f"{root}: no results folder (publish a study with ddl-dyn publish)")
    return sorted(p for p in root.iterdir() if (p / REPORT).is_file() or shipped(p))
