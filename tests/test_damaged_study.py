"""Damaged published studies: ``docs`` and ``compare`` name every damaged field of a
``report.json``, ``run.json`` or ``experiment.toml`` (file and entry) in one line, exit 2,
and never fail inside (exit 3). A seeded generator damages the files of a small study
hundreds of ways: missing, wrong-typed and out-of-range fields."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from ddl_dynamics.cli import main
from ddl_dynamics.publish import pages

ROOT = Path(__file__).resolve().parent.parent
#: What a field is damaged into: removed, or a value of another type or out of range.
DAMAGE: list[Any] = [
    None,
    "abc",
    "",
    7,
    -1,
    1e308,
    -1e308,
    10**30,
    float("nan"),
    float("inf"),
    True,
    [],
    ["x"],
    {},
    {"x": 1},
]


@pytest.fixture(scope="module")
def study(tiny_study, tmp_path_factory) -> Path:
    """A published tiny study as ``report.json`` alone (without the cells a later read
    judges again), read only: copy it before damaging it."""
    results = tmp_path_factory.mktemp("study") / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    folder = results / "tiny"
    for shipped in ("cells.csv", "record.json"):
        (folder / shipped).unlink(missing_ok=True)
    return folder


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A copy of the pages ``docs`` rewrites; the headline figure, drawn from the checked
    comparisons and slow to draw, left out."""
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    monkeypatch.setattr(pages, "headline_figure", lambda reports, path: path)
    return tmp_path


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every entry of a JSON value, as the keys and indices that reach it."""
    found = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*at, i))
    return found


def damaged(data: Any, path: tuple[Any, ...], damage: Any) -> Any:
    """A copy of ``data`` with the entry at ``path`` removed (``damage`` is ``...``) or
    replaced by ``damage``."""
    data = json.loads(json.dumps(data))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if damage is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = damage
    return data


def cases(data: Any, count: int, seed: int) -> list[tuple[tuple[Any, ...], Any]]:
    rng = random.Random(seed)
    every = paths(data)
    return [(p, rng.choice([..., *DAMAGE])) for p in rng.sample(every, min(count, len(every)))]


def toml(value: Any) -> str:
    """A JSON value as a TOML value (inline tables and arrays)."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items() if v is not None)
            + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value if v is not None) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and abs(value) == float("inf"):
        return "inf" if value > 0 else "-inf"
    return json.dumps(value)


def outcome(capsys, results: Path, site: Path) -> list[tuple[int, str]]:
    """The exit code and stderr of ``docs`` and of ``compare`` of the study with itself."""
    found = []
    for argv in (
        ["docs", "--results", str(results), "--out", str(site)],
        ["compare", str(results / "tiny"), str(results / "tiny")],
    ):
        code = main(argv)
        found.append((code, capsys.readouterr().err))
    return found


def assert_clean(found: list[tuple[int, str]], what: str) -> None:
    for code, err in found:
        assert code in (0, 1, 2), f"{what}: {err}"
        if code == 2:
            (line,) = err.splitlines()
            assert line.startswith("ddl-dyn: error:"), f"{what}: {err}"


@pytest.mark.slow
def test_every_damaged_report_field_is_named_or_harmless(study, site, tmp_path, capsys):
    report = json.loads((study / "report.json").read_text())
    named = 0
    for path, damage in cases(report, 250, seed=0):
        results = tmp_path / "results"
        shutil.rmtree(results, ignore_errors=True)
        shutil.copytree(study, results / "tiny")
        (results / "tiny" / "report.json").write_text(json.dumps(damaged(report, path, damage)))
        found = outcome(capsys, results, site)
        assert_clean(found, f"report.json {path} = {damage!r}")
        named += any(code == 2 and "report.json" in err for code, err in found)
    assert named > 150  # most damage is named, not just survived


def test_every_damaged_run_and_experiment_field_is_named_or_harmless(study, site, tmp_path, capsys):
    run = json.loads((study / "run.json").read_text())
    comparison = {
        "model": "ddl",
        "control": "resnet",
        "tasks": ["parity"],
        "split": "test",
        "question": "Does it?",
    }
    documents = [("run.json", run, json.dumps)]
    documents.append(
        (
            "experiment.toml",
            {"comparisons": [comparison]},
            lambda d: "".join(f"{k} = {toml(v)}\n" for k, v in d.items()),
        )
    )
    for name, data, write in documents:
        for path, damage in cases(data, 60, seed=1):
            results = tmp_path / "results"
            shutil.rmtree(results, ignore_errors=True)
            shutil.copytree(study, results / "tiny")
            (results / "tiny" / name).write_text(write(damaged(data, path, damage)))
            assert_clean(outcome(capsys, results, site), f"{name} {path} = {damage!r}")


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda r: r.pop("name"), "report.json: damaged: name: missing"),
        (lambda r: r.update(name=3), "report.json: damaged: name: expected text, got 3"),
        (lambda r: r["comparisons"][0].pop("label"), "comparisons[0].label: missing"),
        (
            lambda r: r["comparisons"][0]["paired"].update(mean="abc"),
            "comparisons[0].paired.mean: expected a finite number, got 'abc'",
        ),
        (lambda r: r.update(comparisons={}), "comparisons: expected a list, got {}"),
        (
            lambda r: r.update(name="../../ESCAPED"),
            "names the study '../../ESCAPED', its folder 'tiny'",
        ),
    ],
)
def test_the_damage_seen_is_named_with_its_file_and_entry(
    study, site, tmp_path, capsys, edit, said
):
    results = tmp_path / "results"
    shutil.copytree(study, results / "tiny")
    report = json.loads((results / "tiny" / "report.json").read_text())
    edit(report)
    (results / "tiny" / "report.json").write_text(json.dumps(report))
    for code, err in outcome(capsys, results, site):
        assert code == 2 and said in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ESCAPED").exists() and not (site / "ESCAPED.md").exists()


def test_a_question_without_its_model_is_named(study, site, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(study, results / "tiny")
    (results / "tiny" / "experiment.toml").write_text(
        '[[comparisons]]\ncontrol = "resnet"\nquestion = "Does it?"\n'
    )
    code, err = outcome(capsys, results, site)[0]
    assert code == 2 and "experiment.toml: damaged: comparisons[0].model: missing" in err


def test_two_studies_with_one_name_are_refused(study, site, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(study, results / "tiny")
    shutil.copytree(study, results / "other")
    code, err = outcome(capsys, results, site)[0]
    assert code == 2 and "other/report.json: names the study 'tiny'" in err
