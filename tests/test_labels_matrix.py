"""The labels across studies: a table per question, a row per pair of rows (the Delta row
first), a column per study and task, over the studies the finding reads."""

from pathlib import Path

import pytest
from test_finding import comparison, report

from ddl_dynamics.analysis.judge.verdicts import BOTH_SOLVED, INCONCLUSIVE, WIN
from ddl_dynamics.publish.matrix import PAGE, labels_page
from ddl_dynamics.publish.pages import write_docs

ROOT = Path(__file__).resolve().parents[1]
TABLES = [{"task": "parity", "rows": [{"model": "ddl", "chosen": "lr=0.01"}]}]


def _study(name, *comparisons, shipped=True):
    return {**report(*comparisons, name=name, tables=TABLES), "shipped": shipped}


def _rows(page, heading):
    table = page.split(f"## {heading}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return table[0], {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}


def test_each_pair_is_a_row_with_a_cell_per_study_and_task():
    one = _study(
        "one",
        comparison("parity", "hc", "ddl", WIN, paired={"mean": -0.5, "ci": 0.1}),
        comparison("overwrite", "ddl", "hc", INCONCLUSIVE, detectable=0.02),
    )
    two = _study("two", comparison("parity", "ddl", "ddl-write", BOTH_SOLVED))
    head, rows = _rows(labels_page([one, two]), "Peers")
    assert (
        head == "| first − second | [`one`](one.md) overwrite (mse ↓) | [`one`](one.md) "
        "parity (mse ↓) |"
    )
    # hc's win over ddl reads as ddl's loss, the difference from ddl's side
    assert rows["`ddl` − `hc`"].endswith("| inconclusive (±0.02) | **loss** +0.5 ± 0.1 |")
    _, erase = _rows(labels_page([one, two]), "The erase term")
    assert erase["`ddl` − `ddl-write`"].endswith("| both solved |")  # untested, said as such


def test_studies_outside_the_finding_are_named_with_why():
    page = labels_page(
        [
            _study("new", comparison("parity", "ddl", "hc", WIN)),
            _study("old", comparison("parity", "ddl", "mhc", WIN), shipped=False),
        ]
    )
    assert "(old.md)" not in page.split("## Outside the matrix")[0]
    assert "- [`old`](old.md): published without its cells" in page


def test_the_page_is_in_the_nav_and_linked_from_both_indexes():
    assert f"      - studies/{PAGE}\n" in (ROOT / "mkdocs.yml").read_text()
    assert f"]({PAGE})" in (ROOT / "docs" / "studies" / "index.md").read_text()
    assert f"(studies/{PAGE})" in (ROOT / "docs" / "index.md").read_text()


def test_a_study_named_as_a_generated_page_is_refused(tiny_study, tmp_path):
    from ddl_dynamics.publish.publish import publish

    publish(tiny_study, tmp_path / "results", "labels")
    with pytest.raises(ValueError, match="a study named 'labels' would overwrite"):
        write_docs(tmp_path / "results", tmp_path)
