"""A published study judged from its shipped data, so that a change of rule needs no rerun.

``results/<study>/`` ships its cells (``cells.csv``, `write_cells`) and what
only the run could compute beside them (``record.json``: the experiment record, how far the
run got, the gate regimes its probes of the trained weights measured and how far those
weights moved their stream mixing). Every read of the study (`study_report`) builds the
report from those files by today's rules;
``report.json`` is that report rendered, a cache that ``ddl-dyn docs`` rewrites
(`refresh_report`) and that a reader can open without the package.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..analysis.mixing import MixingRow
from ..analysis.render.formats import render_json
from ..analysis.report.build import RegimeRow, Report, build_report
from ..analysis.results import CELLS, RECORD, published_run, write_cells
from ..analysis.run import Run
from ..analysis.shape import DamagedError
from ..experiment.folder import write_atomically

#: The rendered report of a published study.
REPORT = "report.json"


def write_study_data(run: Run, report: Report, out: str | Path) -> None:
    """Write ``cells.csv`` and ``record.json`` of ``run`` (read from its run folder) into
    ``out``; ``report`` is the run's own report, whose probed gate regimes and stream mixing
    are kept."""
    if run.folder is None:
        raise ValueError("a study's cells are written from a run folder")
    out = Path(out)
    write_cells(run.folder, run, out / CELLS)
    record = {
        "run_dir": report.run_dir,
        "experiment": run.experiment,
        "progress": report.progress,
        "regimes": [dataclasses.asdict(r) for r in report.regimes],
        "mixing": [dataclasses.asdict(r) for r in report.mixing],
    }
    (out / RECORD).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def shipped(folder: str | Path) -> bool:
    """Whether a published study ships its cells (studies published before they did hold
    their report alone)."""
    return (Path(folder) / CELLS).is_file() and (Path(folder) / RECORD).is_file()


def study_report(folder: str | Path) -> Report:
    """The report of a published study, judged now from its ``cells.csv`` by the rules of
    this version; named after its folder. A damaged ``record.json`` raises
    `DamagedError` naming the file and the field; one written before the stream mixing was
    kept has none."""
    folder = Path(folder)
    path = folder / RECORD
    try:
        record = json.loads(path.read_text())
        regimes = [RegimeRow(**{**r, "stated": tuple(r["stated"])}) for r in record["regimes"]]
        mixing = [MixingRow(**r) for r in record.get("mixing", [])]
        progress = record["progress"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedError(f"{path}: damaged ({type(err).__name__}: {err})") from None
    if not isinstance(progress, str):
        raise DamagedError(f"{path}: damaged: progress: expected text, got {progress!r}")
    report = build_report(published_run(folder))
    return dataclasses.replace(
        report, name=folder.name, regimes=regimes, progress=progress, mixing=mixing
    )


def refresh_report(folder: str | Path) -> bool:
    """Rewrite a shipping study's ``report.json`` where today's rules judge it otherwise
    (or it is missing); whether it was rewritten."""
    path = Path(folder) / REPORT
    text = render_json(study_report(folder)) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    write_atomically(path, lambda file: file.write(text.encode()))
    return True
