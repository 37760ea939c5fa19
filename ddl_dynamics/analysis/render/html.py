"""A self-contained HTML report: tables from the store, figures embedded, provenance.

One file with no external references, so it can be attached to a review as it is.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

from ...experiment.folder import RunFolder
from ..captions import caption
from ..figures import drawn_where_possible, make_figures, writable
from ..judge.labels import INCONCLUSIVE, LOSS, TABLE, WIN
from ..judge.verdicts import CONFIRMED, CONTRADICTED, INSUFFICIENT
from ..probes import probe_run
from ..report.build import Report, build_report
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
from ..run import load_run
from .formats import render_markdown

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 12.5px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; }
.wide { overflow-x: auto; max-width: 100%; margin: .5em 0 1.5em; }
.wide table { margin: 0; } td { overflow-wrap: break-word; } .p { white-space: nowrap; }
table.info th { width: 10em; }
.lead { font-size: 16px; } nav.toc { background: #f7f7f7; padding: .5em 1em; }
details { margin: 0 0 1em; } summary { cursor: pointer; }
pre { background: #f7f7f7; padding: 1em; font-size: 12px; white-space: pre-wrap;
      overflow-wrap: anywhere; }
"""
#: Each claim verdict is styled as the label that decides it.
_CLAIMS = {CONFIRMED: WIN, CONTRADICTED: LOSS, INSUFFICIENT: INCONCLUSIVE}


def _css_class(text: str) -> str:
    """The CSS class of a label or claim verdict: ``"both at floor"`` → ``both-at-floor``."""
    return re.sub("[^a-z0-9]+", "-", text)


def _style() -> str:
    """The style sheet: the page's, then each label's ink (`labels.TABLE`) and each claim
    verdict's."""
    inks = [(label.name, label.ink) for label in TABLE.values()]
    inks += [(claim, TABLE[label].ink) for claim, label in _CLAIMS.items()]
    return _CSS + "".join(
        f".{_css_class(name)} {{ color: {ink}; font-weight: 600; }}\n" for name, ink in inks if ink
    )


#: The columns of p-values, kept on one line: a p broken inside its digits misreads.
P_COLUMNS = ("p", "p Holm")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], tag: int | None = None) -> str:
    """An HTML table; column ``tag``, if given, also gives each cell its label (its text
    before any parenthesis) as CSS class; the p-value columns (`P_COLUMNS`) never wrap."""
    whole = {i for i, h in enumerate(head) if h in P_COLUMNS}

    def cell(c: str, column: int) -> str:
        css = _css_class(c.split(" (")[0]) if column == tag else "p" if column in whole else ""
        attribute = f' class="{css}"' if css else ""
        return f"<td{attribute}>{html.escape(str(c))}</td>"

    th = "".join(
        f'<th class="p">{html.escape(h)}</th>' if i in whole else f"<th>{html.escape(h)}</th>"
        for i, h in enumerate(head)
    )
    body = "".join(
        "<tr>" + "".join(cell(c, i) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return (
        f'<div class="wide"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (
        f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'
        f"<figcaption><b>{html.escape(path.stem)}</b>. "
        f"{html.escape(caption(path.stem))}</figcaption>"
        "</figure>"
    )


def _section(sections: list[tuple[str, str]], title: str) -> str:
    """An ``<h2>`` with an anchor, listed in the table of contents."""
    anchor = re.sub("[^a-z0-9]+", "-", title.lower()).strip("-")
    sections.append((anchor, title))
    return f'<h2 id="{anchor}">{html.escape(title)}</h2>'


def _info(rows: Sequence[tuple[str, str]]) -> str:
    """The run-info table: one header cell per row, no empty header row."""
    body = "".join(
        f'<tr><th scope="row">{html.escape(k)}</th><td>{html.escape(v)}</td></tr>' for k, v in rows
    )
    return f'<div class="wide"><table class="info"><tbody>{body}</tbody></table></div>'


def _config(text: str) -> str:
    """What was run: the experiment file as the run recorded it (its options listed below
    it), folded, and wrapped to the page."""
    if not text.strip():
        return "<p>The run recorded no experiment file.</p>"
    return (
        '<details class="config"><summary>Experiment file, as run</summary>'
        f"<pre>{html.escape(text)}</pre></details>"
    )


def render_html(report: Report, figures: Sequence[Path] = ()) -> str:
    """The report as one HTML page: what the run is, a summary (labels, verdict matrix,
    results in words), a table of contents, then the long tables; ``figures`` are PNG files
    to embed, in order."""
    sections: list[tuple[str, str]] = []  # (anchor, title) of each section, in order
    matrix = [path for path in figures if path.stem == "verdicts"]
    crossover = [path for path in figures if path.stem.startswith("crossover")]
    parts = [
        *_summary(report, matrix, sections),
        *_verdicts(report, crossover, sections),
        *_results(report, sections),
    ]
    rest = [path for path in figures if path not in matrix + crossover]
    if rest:
        parts += [_section(sections, "Figures"), *(_figure(path) for path in rest)]
    toc = (
        '<nav class="toc"><b>Contents</b><ol>'
        + "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in sections)
        + "</ol></nav>"
    )
    body = "\n".join([*_lead(report), toc, *parts])
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>ddl_dynamics — {html.escape(report.name)}</title><style>{_style()}</style>"
        f"</head><body>\n{body}\n</body></html>\n"
    )


def _lead(report: Report) -> list[str]:
    """The title, the lead sentence, what ran where, and the experiment file."""
    exp = report.experiment
    versions = exp.get("versions", {})
    machine = exp.get("machine", {})
    return [
        f"<h1>Experiment <code>{html.escape(report.name)}</code></h1>",
        f'<p class="lead">{html.escape(lead_text(report))}</p>',
        _info(
            [
                ("run folder", report.run_dir),
                ("cells", report.cells_text),
                ("software", ", ".join(f"{k} {v}" for k, v in versions.items())),
                ("machine", ", ".join(f"{k}: {v}" for k, v in machine.items())),
                ("started / ended", f"{exp.get('started_at', '—')} / {exp.get('ended_at') or '—'}"),
            ]
        ),
        _config(exp.get("config") or ""),
    ]


def _summary(report: Report, matrix: Sequence[Path], sections: list[tuple[str, str]]) -> list[str]:
    """The labels counted, the verdict matrix (its figure, else its table), the summary."""
    parts = [
        _section(sections, "Summary"),
        f"<p>{len(report.comparisons)} comparisons, {report.tests} tests: "
        f"{html.escape(counts_text(counts(report.comparisons)) or 'none')}.</p>",
    ]
    if untuned(report):
        parts.append(f"<p><b>{html.escape(UNTUNED_NOTE)}</b></p>")
    parts += [_figure(path) for path in matrix]
    if not matrix and (cells := matrix_cells(report))[1]:
        parts.append(_table(*cells))
    parts.append(
        "<ul>" + "".join(f"<li>{_code(line)}</li>" for line in summary_lines(report)) + "</ul>"
    )
    return parts


def _verdicts(
    report: Report, crossover: Sequence[Path], sections: list[tuple[str, str]]
) -> list[str]:
    """The comparisons, the expectations and the crossovers with their figures."""
    head, rows = comparison_cells(report)
    parts = [
        _section(sections, "Verdicts"),
        f"<p>{html.escape(COMPARISON_NOTE)} This report draws {report.tests} tests.</p>",
        _table(head, rows, tag=head.index("verdict")),
    ]
    if report.expectations:
        head, rows = expectation_cells(report)
        parts += [
            _section(sections, "Expectations against the measured seeds"),
            f"<p>{html.escape(EXPECTATION_NOTE)}</p>",
            _table(head, rows, tag=head.index("verdict")),
        ]
    if report.crossovers:
        parts += [_section(sections, "Crossover"), f"<p>{html.escape(CROSSOVER_NOTE)}</p>"]
        for title, head, rows in crossover_cells(report):
            parts += [f"<h3>{html.escape(title)}</h3>", _table(head, rows)]
        parts += [_figure(path) for path in crossover]
    return parts


def _results(report: Report, sections: list[tuple[str, str]]) -> list[str]:
    """Each task's rows with their flags and problems, the gate regimes, the stream mixing."""
    parts = [_section(sections, "Results per task"), f"<p>{html.escape(TABLE_NOTE)}</p>"]
    for table in report.tables:
        title = metric_title(table.task, table.metric, table.higher_is_better, table.floor)
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(_table(*table_cells(table)))
        parts += [f"<p>{html.escape(note)}</p>" for note in flag_notes(table)]
        if table.problems:
            items = "".join(
                f"<li>{html.escape(who(p))}: <b>{html.escape(p.status)}</b> — "
                f"{html.escape(p.message)}</li>"
                for p in table.problems
            )
            parts.append(f"<ul>{items}</ul>")
    if report.regimes:
        parts += [
            _section(sections, "Gate regimes used by the trained Delta stacks"),
            f"<p>{_code(REGIME_NOTE)}</p>",
            _table(*regime_cells(report)),
        ]
    if report.mixing:
        parts += [
            _section(sections, "Stream mixing of the trained Hyper-Connections stacks"),
            f"<p>{_code(MIXING_NOTE)}</p>",
            _table(*mixing_cells(report.mixing)),
        ]
    return parts


def _code(text: str) -> str:
    """Escaped text with its `backticks` as <code>."""
    return re.sub("`([^`]+)`", r"<code>\1</code>", html.escape(text))


def write_html_report(run: str | Path | RunFolder, path: str | Path | None = None) -> Path:
    """Probe and plot what is missing, then write ``<run_dir>/report.html`` (or ``path``).
    A run folder on read-only storage is only read: its probes stay in memory and its
    figures in a temporary folder, so ``path`` elsewhere is all the report needs."""
    run_dir = run.path if isinstance(run, RunFolder) else Path(run)
    path = Path(path) if path is not None else run_dir / "report.html"
    if not writable(path.parent):  # say so before probing and drawing everything
        raise OSError(f"cannot write {path}: read-only or no permission (give --output elsewhere)")
    read = load_run(run)
    with drawn_where_possible(run_dir):
        probe_run(read)
        report = build_report(read)
        figures = [p for p in make_figures(read, report=report) if p.suffix == ".png"]
        path.write_text(render_html(report, figures))
        if writable(Path(run_dir)):  # the run's markdown from the same, probed report
            (Path(run_dir) / "report.md").write_text(render_markdown(report))
    return path
