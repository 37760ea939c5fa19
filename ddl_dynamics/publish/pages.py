"""The documentation's generated parts, from the published results and the code alone.

``ddl-dyn docs`` (`write_docs`) reads ``results/<study>/`` (`publish`), never a run
folder, and writes:

- the README's headline (`front`), between ``<!-- results:start -->`` and
  ``<!-- results:end -->``: the finding over the tuned studies (`finding`: each distinct
  test once, by question, the Delta row first), the headline figure, and the Transformer
  studies' findings question by question;
- ``docs/headline.png``: every finding by question, its difference in units of its task's
  margin with the margin drawn, coloured by its label, at most 1,600 px tall
  (`figures.draw_headline`);
- ``docs/studies/<study>.md`` and ``docs/studies/index.md``: per study its answer to its
  questions (`answer`), its comparisons as sentences (`wording`) and tables, the rows per
  task (descriptive), the expectations, its figures (copied beside the page) and the line
  that reproduces it; each in the site's nav (``mkdocs.yml``, between its
  ``# studies:start`` and ``# studies:end`` lines);
- ``docs/studies/labels.md``: the labels across the studies the finding reads, a table per
  question (`matrix`);
- the generated blocks of ``docs/running-experiments.md`` (every training key with its
  default and its check, probed from `TrainConfig`, and the
  entry keys from the config dataclasses) and of ``docs/reading-the-report.md`` (the labels,
  what they mean and the words a text may use for them).

Every number in these files comes from ``results/``; a test regenerates them into a copy and
diffs. A figure is rewritten only when the data it draws changes (its PNG carries a digest
of them), so that regenerating on another machine leaves the checkout unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Sequence
from operator import methodcaller
from pathlib import Path
from typing import Any

from .._task import Task, TaskData, held_out
from ..analysis.judge.verdicts import LABELS
from ..analysis.report.wording import MEANINGS
from ..experiment.config import (
    DEVICE_RULE,
    NO_LIMITS,
    TRAIN_BOUNDS,
    ComparisonSpec,
    ModelEntry,
    Override,
    TaskEntry,
    TrainConfig,
    check_name,
)
from ..experiment.folder import write_atomically
from ..experiment.grid import TUNABLE
from .finding import (
    in_finding,
)
from .front import HEADLINE, headline_figure, index_page, readme_block
from .matrix import PAGE as LABELS_PAGE
from .matrix import labels_page
from .publish import FIGURES, load_study, studies
from .study import refresh_report, shipped
from .study_page import GENERATED, markdown_table, study_page

#: The list, in ``docs/studies/``, of the files there that ``docs`` generated: only those
#: it ever removes (hidden, so the site leaves it out).
MANIFEST = ".generated"
MANIFEST_HEAD = "# written by `ddl-dyn docs`: the files here it generated, which it may remove"


def block(text: str, name: str, body: str) -> str:
    """``text`` with the block between ``<!-- name:start -->`` and ``<!-- name:end -->``
    replaced by ``body``; a file without the markers raises ValueError."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {start} … {end} block to regenerate")
    return pattern.sub(lambda _: f"{start}\n{GENERATED}\n\n{body.strip()}\n\n{end}", text, count=1)


def nav_block(text: str, names: Sequence[str]) -> str:
    """``mkdocs.yml`` with one nav entry per study between its ``# studies:start`` and
    ``# studies:end`` comment lines (indented as the start line is)."""
    found = re.search(r"^( *)# studies:start.*\n(?:.*\n)*?( *)# studies:end", text, re.M)
    if not found:
        raise ValueError("mkdocs.yml: no '# studies:start' … '# studies:end' lines")
    indent = found.group(1)
    entries = "".join(f"{indent}- studies/{name}.md\n" for name in names)
    first = found.group(0).splitlines()[0]
    return text[: found.start()] + f"{first}\n{entries}{indent}# studies:end" + text[found.end() :]


# --- generated reference blocks


def _train_rule(name: str) -> str:
    """What `TrainConfig` rejects for field ``name``, as its declared bounds say."""
    if name == "device":
        return DEVICE_RULE
    if name not in TRAIN_BOUNDS:
        return "—"
    sign, limit = TRAIN_BOUNDS[name]
    return f"must be {sign}" + (f"; more than {limit:,}" if limit is not None else "")


def _type(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type(arg) for arg in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(tp))
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "").replace("tuple[str, ...]", "list of labels")


def _entry_default(f: dataclasses.Field[Any]) -> str:
    """An entry key's default as the key table gives it."""
    if f.name == "label":
        return "its `name`"
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "required"


def config_block() -> str:
    """Every training key with its default, whether a grid may tune it, and its check; then
    the keys of each entry table, from the dataclasses themselves."""
    hints = typing.get_type_hints(TrainConfig)
    rows = [
        [
            f"`{f.name}`",
            _type(hints[f.name]).replace("NoneType", "None"),
            f"`{f.default!r}`",
            "yes" if f.name in TUNABLE else "no",
            _train_rule(f.name),
        ]
        for f in dataclasses.fields(TrainConfig)
    ]
    lines = [
        "### Training keys (`[defaults.train]`, and `train` of any entry)",
        "",
        " ".join((TrainConfig.__doc__ or "").split()),
        "",
        *markdown_table(["key", "type", "default", "tunable", "rejected when"], rows),
        "",
        f"Bounds beyond any sane run are lifted by setting `{NO_LIMITS}=1`.",
        "",
    ]
    entries = (
        ("`[[tasks]]`", TaskEntry, ("sweep",)),
        ("`[[models]]`", ModelEntry, ("options",)),
        ("`[[overrides]]`", Override, ()),
        ("`[[comparisons]]`", ComparisonSpec, ()),
    )
    for title, cls, internal in entries:
        rows = [
            [f"`{f.name}`", _entry_default(f)]
            for f in dataclasses.fields(cls)
            if f.name not in internal
        ]
        doc = cls.__doc__ or ""
        lines += [
            f"### {title}",
            "",
            *(
                [" ".join(doc.split()), ""]
                if doc and not doc.startswith(cls.__name__ + "(")
                else []
            ),
            *markdown_table(["key", "default"], rows),
            "",
        ]
    lines.append(
        "Any other key of a `[[models]]` entry is an option of its model family "
        "(`ddl-dyn models`; unknown options are rejected with the valid ones)."
    )
    return "\n".join(lines)


class _Bare(Task):
    """A task that states nothing of its own: what a task inherits from `Task`."""

    @property
    def in_dim(self) -> int:
        return 0

    @property
    def out_dim(self) -> int:
        return 0

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        raise NotImplementedError("a stand-in that reads Task's defaults; it samples nothing")


def task_block() -> str:
    """One table of what a task states: every attribute of `Task` with its
    default and its comment in the source, then the fields of a sampled split."""
    source = inspect.getsource(Task).splitlines()
    rows, comment = [], []
    for line in source:
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        found = re.match(r"(\w+): (ClassVar\[(.*)\]|\w+) = (.*)$", text)
        if found and line.startswith("    ") and not line.startswith("     "):
            kind = found.group(3) or found.group(2)
            rows.append(
                [
                    f"`{found.group(1)}`",
                    f"`{kind}`",
                    f"`{found.group(4)}`",
                    " ".join(comment) or "—",
                ]
            )
        if not text.startswith("#:"):
            comment = []
    rows += [
        [f"`{name}`", "property", "required", "input / output width"]
        for name in ("in_dim", "out_dim")
    ]
    rows.append(
        [
            "`control_dim`",
            "property",
            f"`{_Bare().control_dim}`",
            "width of the per-step controls (`TaskData.controls`); 0: none",
        ]
    )
    for call, method in (
        ("sample(n, seed, split)", Task.sample),
        ("check_split(split)", Task.check_split),
        ("split_steps(split)", Task.split_steps),
    ):
        given = "required" if getattr(method, "__isabstractmethod__", False) else "provided"
        rows.append([f"`{call}`", "method", given, " ".join((method.__doc__ or "").split())])
    data = (TaskData.__doc__ or "").split("Attributes:")[-1]
    fields = re.findall(r"^\s+(\w+): (.*?)(?=^\s+\w+: |\Z)", data, re.S | re.M)
    held = " ".join((held_out.__doc__ or "").split()).split(". ")[0]
    return "\n".join(
        [
            *markdown_table(["attribute", "type", "default", "what it states"], rows),
            "",
            "A split is a `TaskData`:",
            "",
            *markdown_table(
                ["field", "what it holds"], [[f"`{n}`", " ".join(d.split())] for n, d in fields]
            ),
            "",
            f"`held_out(...)`: {held}.",
        ]
    )


def labels_block() -> str:
    """The rule book's glossary: every label, what it means, the words a text may use."""
    rows = [
        [f"**{label}**", *MEANINGS.get(label, ("see the rule book", "its name"))]
        for label in LABELS
    ]
    return "\n".join(markdown_table(["label", "what it means", "the words a text may use"], rows))


# --- writing everything


def _write(path: Path, data: str | bytes, written: list[Path]) -> None:
    """Write ``data`` where it differs from the file's (so an unchanged file keeps its
    time), through a temporary renamed over it: a run killed meanwhile leaves the old file
    or the new one, never half of one."""
    content = data.encode() if isinstance(data, str) else data
    if not path.is_file() or path.read_bytes() != content:
        write_atomically(path, methodcaller("write", content))
    written.append(path)


def _judged_reports(results: str | Path) -> list[dict[str, Any]]:
    """Every published study's report, those that ship their cells judged again by today's
    rules first (their report.json rewritten)."""
    for folder in studies(results):
        if shipped(folder):
            refresh_report(folder)
    reports = [load_study(folder) for folder in studies(results)]
    if not reports:
        raise ValueError(f"{results}: no published study (ddl-dyn publish RUN_DIR first)")
    for r in reports:
        r.setdefault("description", "")
    return reports


def write_docs(
    results: str | Path = "results", out: str | Path = "."
) -> tuple[list[Path], list[Path]]:
    """Regenerate every generated page, block and figure under ``out`` from ``results``, the
    README last; returns the files written and those removed: the pages and figures of
    ``docs/studies/`` an earlier run generated (its `MANIFEST`) and this one does not
    (a file put there by hand stays)."""
    out = Path(out)
    reports = _judged_reports(results)
    written: list[Path] = []
    pages = out / "docs" / "studies"
    figures = {
        folder.name: sorted(p.name for p in (folder / FIGURES).glob("*.png"))
        for folder in studies(results)
    }
    taken = {"index", LABELS_PAGE.removesuffix(".md")} & {r["name"] for r in reports}
    if taken:
        raise ValueError(
            f"{results}: a study named {sorted(taken)[0]!r} would overwrite the "
            "docs' page of that name: publish it under another --name"
        )
    generated = {
        "index.md",
        LABELS_PAGE,
        *(f"{r['name']}.md" for r in reports),
        *(f"{name}/{f}" for name, found in figures.items() for f in found),
    }
    before = set(_read_manifest(pages))
    _write(pages / MANIFEST, _manifest(before | generated), [])  # a kill leaves both listed
    for folder, r in zip(studies(results), reports, strict=True):
        for f in figures[folder.name]:
            _write(pages / r["name"] / f, (folder / FIGURES / f).read_bytes(), written)
        _write(pages / f"{r['name']}.md", study_page(r, figures[folder.name]), written)
    _write(pages / "index.md", index_page(reports), written)
    _write(pages / LABELS_PAGE, labels_page(reports), written)
    nav = out / "mkdocs.yml"
    _write(nav, nav_block(nav.read_text(), [r["name"] for r in reports]), written)
    for page, name, body in (
        ("running-experiments.md", "config", config_block()),
        ("reading-the-report.md", "labels", labels_block()),
        ("adding-a-task.md", "task", task_block()),
    ):
        path = out / "docs" / page
        _write(path, block(path.read_text(), name, body), written)
    written.append(headline_figure([r for r in reports if in_finding(r)], out / HEADLINE))
    removed = [pages / stale for stale in sorted(before - generated) if (pages / stale).is_file()]
    for path in removed:
        path.unlink()
        if path.parent != pages and not any(path.parent.iterdir()):
            path.parent.rmdir()
    _write(pages / MANIFEST, _manifest(generated), [])
    readme = out / "README.md"
    _write(readme, block(readme.read_text(), "results", readme_block(reports)), written)
    return written, removed


def _read_manifest(pages: Path) -> list[str]:
    """The files of ``docs/studies/`` the last run generated (none where it kept no list);
    a line that is not a page or a study's figure there raises ValueError."""
    path = pages / MANIFEST
    files = path.read_text().splitlines()[1:] if path.is_file() else []
    for i, line in enumerate(files, start=2):
        parts = line.split("/")
        try:
            if len(parts) > 2:
                raise ValueError("more than a study's folder and a file")
            for part in parts:
                check_name(part, "a file docs generated")
        except ValueError as err:
            raise ValueError(
                f"{path}: line {i}: {line!r} is not a page or figure of "
                f"{pages} ({err}); correct or remove the line"
            ) from None
    return files


def _manifest(files: set[str]) -> str:
    return MANIFEST_HEAD + "\n" + "".join(f"{f}\n" for f in sorted(files))
