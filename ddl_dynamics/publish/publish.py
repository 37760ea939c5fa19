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
import math
import shutil
import tomllib
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ..analysis.figures import NothingToDraw, compare_figures, run_colors
from ..analysis.render.formats import render_json
from ..analysis.report.build import Report, build_report
from ..analysis.run import Run, load_run
from ..analysis.shape import DamagedError, check_shape
from ..experiment.config import COUNTED, ComparisonSpec, check_name
from ..models.operator import REGIMES
from .study import REPORT, shipped, study_report, write_study_data

#: The files of a published study (beside its report and cells, `study`).
EXPERIMENT, RUN, FIGURES = "experiment.toml", "run.json", "figures"
#: The one hand-written file of a published study: which labels a rerun changed against its
#: earlier runs, named in words (the numbers stay in the report). Publishing again keeps it.
CHANGES = "changes.md"


def publish(
    run_dir: str | Path,
    results: str | Path = "results",
    name: str | None = None,
    command: str | None = None,
    allow_partial: bool = False,
) -> Path:
    """Write ``results/<name>/`` from a finished run folder (``name``: the experiment's); a
    run that did not finish is refused unless ``allow_partial``, and run.json then says what
    it lacks.

    The study is written whole into a hidden sibling, ``changes.md`` copied over, and then
    swapped in by two renames: a publish killed at any moment leaves the old study or the
    new one whole (killed between the renames, the old one waits in ``.<name>.old``, and the
    next publish puts it back). Nothing but ``results/<name>`` and its siblings is touched.
    """
    run = load_run(run_dir)
    if not run.rows:
        raise ValueError(f"{run_dir}: no results to publish")
    lacks = unfinished(run)
    if lacks and not allow_partial:
        raise ValueError(
            f"{run_dir}: {lacks}; finish it (ddl-dyn run resumes it) or publish "
            "it with --allow-partial"
        )
    report = build_report(run)
    name = check_name(
        report.name if name is None else name, "a study's name names its folder results/NAME"
    )
    out = Path(results) / name
    _recover(out)
    if out.is_symlink() or (out.exists() and not ((out / REPORT).is_file() or shipped(out))):
        raise ValueError(f"{out}: exists and is not a published study; not replacing it")
    new = _beside(out, "new")
    if new.exists():
        shutil.rmtree(new)  # a publish killed while writing
    (new / FIGURES).mkdir(parents=True)
    report = replace(report, name=name, run_dir=f"runs/{name}")  # where a rerun puts it
    write_study_data(run, report, new)
    report = replace(study_report(new), name=name)  # judged from the shipped cells
    (new / REPORT).write_text(render_json(report) + "\n")
    (new / EXPERIMENT).write_text(run.experiment.get("config", ""))
    (new / RUN).write_text(
        json.dumps(asdict(provenance(run, name, command, lacks)), indent=1) + "\n"
    )
    drawn = {p.name for p in _draw(run, report, new)}
    kept = Path(run_dir) / FIGURES
    for png in sorted(kept.glob("*.png")) if kept.is_dir() else ():
        if png.name not in drawn:
            shutil.copyfile(png, new / FIGURES / png.name)
    if (out / CHANGES).is_file():
        shutil.copyfile(out / CHANGES, new / CHANGES)
    _swap(new, out)
    return out


def unfinished(run: Run) -> str:
    """What a run lacks to be published as a finished study, in words ("" where nothing):
    its end, cells never stored, or any finished cell."""
    progress = run.progress
    if progress is None:
        return "no run started"
    lacks = [] if progress.ended else ["the run did not end"]
    if progress.finished < progress.selected:
        lacks.append(
            f"{progress.selected - progress.finished} of {progress.selected} cells missing"
        )
    if not any(c.status in COUNTED for row in run.rows.values() for c in row.cells):
        lacks.append("no cell finished")
    return "; ".join(lacks)


def _beside(out: Path, role: str) -> Path:
    """The hidden sibling of study folder ``out`` that holds its ``role`` (``new``: being
    written; ``old``: moved aside)."""
    return out.with_name(f".{out.name}.{role}")


def _swap(new: Path, out: Path) -> None:
    """Put folder ``new`` in the place of ``out``: old aside, new in, old removed."""
    old = _beside(out, "old")
    if out.exists():
        out.rename(old)
    new.rename(out)
    if old.exists():
        shutil.rmtree(old)


def _recover(out: Path) -> None:
    """Finish a swap a killed publish left halfway: the old study back where the new one
    never arrived, else what is left of the old one removed."""
    old = _beside(out, "old")
    if old.is_dir() and not out.exists():
        old.rename(out)
    elif old.is_dir():
        shutil.rmtree(old)


def _draw(run: Run, report: Report, out: Path) -> list[Path]:
    """The figures drawn from the report alone, into ``out/figures`` (the run folder
    untouched); PNG only; none where no cell finished (a partial run)."""
    try:
        drawn = compare_figures(replace(run, run_dir=out), report, run_colors(run))
    except NothingToDraw:
        return []
    for path in drawn:
        if path.suffix != ".png":
            path.unlink()
    return [p for p in drawn if p.suffix == ".png"]


@dataclass(frozen=True)
class Provenance:
    """What ran a study (``run.json``): the command, software, machine, dates (of the first
    run into its folder and of the latest) and the time it took (``wall_time_s``: the summed
    span of every run into the folder, so a resumed or grown study counts each part; and the
    cells' summed training time); ``partial``: what an unfinished run published with
    ``--allow-partial`` lacks."""

    study: str
    command: str
    versions: dict[str, str]
    machine: dict[str, Any]
    started_at: str | None
    ended_at: str | None
    wall_time_s: float | None
    cell_time_s: float
    cells: int
    partial: str = ""


def provenance(run: Run, name: str, command: str | None = None, partial: str = "") -> Provenance:
    """The provenance of ``run`` published as study ``name``."""
    exp = run.experiment
    spans = (
        run.folder.store.spans()
        if run.folder is not None
        else [(exp.get("started_at"), exp.get("ended_at"))]
    )
    started, ended = spans[0][0] if spans else None, exp.get("ended_at")
    span = None
    if spans and all(start and end for start, end in spans):
        span = sum(
            (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
            for start, end in spans
            if start and end
        )
    cells = [c for row in run.rows.values() for c in row.cells]
    return Provenance(
        name,
        command or f"ddl-dyn run experiments/{name}.toml",
        exp.get("versions", {}),
        exp.get("machine", {}),
        started,
        ended,
        span,
        sum(c.wall_time or 0.0 for c in cells),
        len(cells),
        partial,
    )


def load_study(folder: str | Path) -> dict[str, Any]:
    """A published study's report (``report.json``, or judged now from its cells where it
    ships them: ``"shipped"``) as a dict, its ``run.json`` under ``"run"``; a folder that
    is not a published study, or a file with a damaged field (named
    with its file and entry), raises ValueError."""
    folder = Path(folder)
    path = folder / REPORT
    if not path.is_file() and not shipped(folder):
        raise ValueError(
            f"{folder}: not a published study (no {REPORT}; make one with ddl-dyn publish RUN_DIR)"
        )
    check_name(folder.name, "a study's folder names its page")
    report = json.loads(render_json(study_report(folder))) if shipped(folder) else _json(path)
    if not isinstance(report, dict) or "comparisons" not in report:
        raise ValueError(f"{path}: not a report (no comparisons)")
    _check(report, Report, path)
    for i, expectation in enumerate(report["expectations"]):  # written beside the fields
        _check(expectation.get("claim"), str, path, f"expectations[{i}].claim")
    for i, row in enumerate(report.get("regimes", [])):  # the page shows each regime's share
        for regime in REGIMES:
            share = row["fractions"].get(regime)
            if type(share) not in (int, float) or not math.isfinite(share):
                raise DamagedError(
                    f"{path}: damaged: regimes[{i}].fractions[{regime!r}]: "
                    f"expected a finite number, got {share!r}"
                )
    if report["name"] != folder.name:
        raise ValueError(
            f"{path}: names the study {report['name']!r}, its folder "
            f"{folder.name!r} (a copied study?): publish it again under its name"
        )
    run = _json(folder / RUN) if (folder / RUN).is_file() else {}
    if run:
        _check(run, Provenance, folder / RUN)
    changes = (folder / CHANGES).read_text() if (folder / CHANGES).is_file() else ""
    return {
        **report,
        "run": run,
        "questions": questions(folder / EXPERIMENT),
        "changes": changes,
        "shipped": shipped(folder),
    }


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def _check(value: Any, hint: Any, path: Path, where: str = "") -> None:
    """`check_shape`, its message naming the file."""
    try:
        check_shape(value, hint, where)
    except DamagedError as err:
        raise DamagedError(f"{path}: damaged: {err}") from None


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
    _check(data.get("comparisons", []), list[dict[str, Any]], experiment, "comparisons")
    asked = []
    for i, c in enumerate(data.get("comparisons", [])):
        if c.get("question"):
            _check(c, ComparisonSpec, experiment, f"comparisons[{i}]")
            asked.append(
                {
                    "question": c["question"],
                    "model": c["model"],
                    "control": c["control"],
                    "tasks": list(c.get("tasks", [])),
                    "split": c.get("split", "test"),
                }
            )
    return asked


def studies(results: str | Path = "results") -> list[Path]:
    """The published study folders under ``results``, by name."""
    root = Path(results)
    if not root.is_dir():
        raise ValueError(f"{root}: no results folder (publish a study with ddl-dyn publish)")
    for aside in root.glob(".*.old"):
        if not (root / aside.name[1 : -len(".old")]).exists():
            raise ValueError(
                f"{aside}: a publish was cut short with this study moved aside; "
                "publish it again (or rename it back)"
            )
    return sorted(
        p
        for p in root.iterdir()
        if not p.name.startswith(".")  # being published
        and ((p / REPORT).is_file() or shipped(p))
    )
