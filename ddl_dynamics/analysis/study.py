"""A published study judged from its shipped data, so that a change of rule needs no rerun.

``results/<study>/`` ships its cells (``cells.csv``, `write_cells`) and what
only the run could compute beside them (``record.json``: the experiment record, how far the
run got, and the gate regimes its probes of the trained weights measured). Every read of the
study (`study_report`) builds the report from those files by today's rules;
``report.json`` is that report rendered, a cache that ``ddl-dyn docs`` rewrites
(`refresh_report`) and that a reader can open without the package.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .render import render_json
from .report import RegimeRow, Report, build_report
from .results import CELLS, RECORD, published_run, write_cells
from .run import Run

#: The rendered report of a published study.
REPORT = "report.json"


def write_study_data(run: Run, report: Report, out: str | Path) -> None:
    """Write ``cells.csv`` and ``record.json`` of ``run`` (read from its run folder) into
    ``out``; ``report`` is the run's own report, whose probed gate regimes are kept."""
    if run.folder is None:
        raise ValueError("a study's cells are written from a run folder")
    out = Path(out)
    write_cells(run.folder, run, out / CELLS)
    record = {"run_dir": report.run_dir, "experiment": run.experiment,
              "progress": report.progress,
              "regimes": [dataclasses.asdict(r) for r in report.regimes]}
    (out / RECORD).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def shipped(folder: str | Path) -> bool:
    """Whether a published study ships its cells (studies published before they did hold
    their report alone)."""
    return (Path(folder) / CELLS).is_file() and (Path(folder) / RECORD).is_file()


def study_report(folder: str | Path) -> Report:
    """The report of a published study, judged now from its ``cells.csv`` by the rules of
    this version; named after its folder."""
    folder = Path(folder)
    record = json.loads((folder / RECORD).read_text())
    report = build_report(published_run(folder))
    regimes = [RegimeRow(**{**r, "stated": tuple(r["stated"])}) for r in record["regimes"]]
    return dataclasses.replace(report, name=folder.name, regimes=regimes,
                               progress=record["progress"])


def refresh_report(folder: str | Path) -> bool:
    """Rewrite a shipping study's ``report.json`` where today's rules judge it otherwise
    (or it is missing); whether it was rewritten."""
    path = Path(folder) / REPORT
    text = render_json(study_report(folder)) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
