"""A published study ships its cells, and every read judges them again: the report rebuilt
from ``cells.csv`` is the run folder's, and the pages follow the cells, not a stored
report."""

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from ddl_dynamics.analysis.render.formats import render_json
from ddl_dynamics.analysis.report.build import build_report
from ddl_dynamics.analysis.results import CELLS, RECORD, load_results
from ddl_dynamics.analysis.run import load_run
from ddl_dynamics.cli import main
from ddl_dynamics.publish.publish import load_study
from ddl_dynamics.publish.study import study_report
from ddl_dynamics.publish.study_page import study_page

ROOT = Path(__file__).resolve().parents[1]

#: A tuned study with two learning rates, so that cells beside the chosen ones ship too.
TUNED = """
name = "tuned"
seeds = [0, 1, 2]
[defaults.model]
width = 8
depth = 3
[defaults.train]
steps = 10
batch_size = 32
n_train = 128
n_test = 64
eval_every = 5
[defaults.tune]
lr = [1e-3, 1e-2]
[[tasks]]
name = "overwrite"
[[models]]
name = "resnet"
[[models]]
name = "ddl"
"""


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuned")
    (root / "tuned.toml").write_text(TUNED)
    assert main(["run", str(root / "tuned.toml"), "--run-dir", str(root / "runs" / "tuned")]) == 0
    return root / "runs" / "tuned"


@pytest.mark.parametrize("which", ["tiny", "tuned"])
def test_the_shipped_cells_judge_as_the_run_folder(which, tiny_study, tuned_run, tmp_path):
    run_dir = {"tiny": tiny_study, "tuned": tuned_run}[which]
    assert main(["publish", str(run_dir), "--results", str(tmp_path)]) == 0
    study = tmp_path / which
    with (study / CELLS).open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == len(load_results(run_dir)) >= 12  # the tuned grid grew past its edge
    assert {
        "task",
        "model",
        "seed",
        "status",
        "test",
        "params",
        "flops",
        "config",
        "metrics",
    } <= set(rows[0])
    assert load_results(study) == load_results(run_dir)
    own = build_report(load_run(run_dir))
    own = replace(own, name=which, run_dir=f"runs/{which}")
    assert render_json(study_report(study)) == render_json(own)
    assert (study / "report.json").read_text() == render_json(own) + "\n"


def test_a_study_keeps_its_stream_mixing_and_an_older_record_has_none(mixing_run, tmp_path):
    """How far the trained hc and mhc moved their mixing is measured from the weights, so the
    study keeps it in record.json and its page shows it; a record written before it was
    kept loads, with no table."""
    assert main(["publish", str(mixing_run), "--results", str(tmp_path)]) == 0
    study = tmp_path / "mixing"
    record = json.loads((study / RECORD).read_text())
    assert [(r["task"], r["model"]) for r in record["mixing"]] == [
        ("overwrite", "hc"),
        ("overwrite", "mhc"),
    ]
    assert study_report(study).mixing == build_report(load_run(mixing_run)).mixing
    page = study_page(load_study(study), [])
    assert "## Stream mixing of the trained Hyper-Connections stacks" in page
    assert "| overwrite | mhc | 2 | 2 |" in page
    del record["mixing"]
    (study / RECORD).write_text(json.dumps(record))
    assert study_report(study).mixing == []
    assert "Stream mixing" not in study_page(load_study(study), [])


def _docs_tree(tmp_path: Path, results: Path) -> dict[str, bytes]:
    assert main(["docs", "--results", str(results), "--out", str(tmp_path)]) == 0
    paths = [
        tmp_path / "README.md",
        *sorted((tmp_path / "docs").rglob("*")),
        *sorted(results.rglob("*")),
    ]
    return {str(p.relative_to(tmp_path)): p.read_bytes() for p in paths if p.is_file()}


def test_docs_restore_a_deleted_report_and_follow_an_edited_cell(tiny_study, tmp_path):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    before = _docs_tree(tmp_path, results)
    report = results / "tiny" / "report.json"
    report.unlink()
    assert _docs_tree(tmp_path, results) == before  # byte for byte, report.json included

    cells = results / "tiny" / CELLS
    with cells.open(newline="") as file:
        rows = list(csv.DictReader(file))
    first = next(r for r in rows if r["model"] == "ddl" and r["task"] == "parity")
    metrics = json.loads(first["metrics"])
    metrics["test"] = 0.123456
    first["metrics"] = json.dumps(metrics, sort_keys=True)
    with cells.open("w", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    after = _docs_tree(tmp_path, results)
    assert "0.123456" in after["results/tiny/report.json"].decode()
    changed = {name for name in before if before[name] != after.get(name)}
    assert {"results/tiny/report.json", "docs/studies/tiny.md"} <= changed


def _damage_cells(study: Path, column: str, value: str) -> None:
    with (study / CELLS).open(newline="") as file:
        rows = list(csv.DictReader(file))
    rows[0][column] = value
    with (study / CELLS).open("w", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(
    ("where", "damage"),
    [
        ("cells", ("seed", "abc")),
        ("cells", ("metrics", "{not json")),
        ("cells", ("config", "[]")),
        ("cells", ("params", "1.5e")),
        ("record", {"run_dir": "runs/tiny"}),
        ("record", "[]"),
        ("record", {"run_dir": "runs/tiny", "experiment": {}, "progress": 3, "regimes": []}),
        ("record", {"run_dir": "runs/tiny", "experiment": {}, "progress": "", "regimes": [{}]}),
        (
            "record",
            {
                "run_dir": "runs/tiny",
                "experiment": {},
                "progress": "",
                "regimes": [],
                "mixing": [{"task": "overwrite"}],
            },
        ),
    ],
)
def test_damaged_shipped_cells_are_one_clear_message(tiny_study, tmp_path, capsys, where, damage):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    study = results / "tiny"
    if where == "cells":
        _damage_cells(study, *damage)
    else:
        (study / "record.json").write_text(
            damage if isinstance(damage, str) else json.dumps(damage)
        )
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    capsys.readouterr()
    assert main(["docs", "--results", str(results), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("cells.csv" in err or "record.json" in err), err
