"""``ddl-dyn compare`` says what it compares: a rerun of another experiment and two sides
without a comparison are refused, and a comparison without a mean says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ddl_dynamics.cli import main
from ddl_dynamics.publish.reproduce import Check


def _published(tiny_study: Path, results: Path) -> Path:
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    return results / "tiny"


def _report(folder: Path, edit) -> None:
    """Edit a published study's report, as a study published before it shipped its cells."""
    for shipped in ("cells.csv", "record.json"):
        (folder / shipped).unlink(missing_ok=True)
    path = folder / "report.json"
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))


def test_a_rerun_of_another_experiment_is_named(tiny_study, tmp_path, capsys):
    reference = _published(tiny_study, tmp_path / "results")
    _report(reference, lambda r: r["experiment"].update(name="regimes"))
    capsys.readouterr()
    assert main(["compare", str(tiny_study), str(reference)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "ran experiment 'tiny'" in line and "is of 'regimes': not a rerun of it" in line


def test_a_study_published_under_another_name_is_still_its_experiment(tiny_study, tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results), "--name", "v2"]) == 0
    assert main(["compare", str(tiny_study), str(results / "v2")]) == 0


def test_nothing_to_compare_is_named(tiny_study, tmp_path, capsys):
    reference = _published(tiny_study, tmp_path / "results")
    _report(reference, lambda r: r.update(comparisons=[], expectations=[]))
    other = tmp_path / "other" / "tiny"
    shutil.copytree(reference, other)
    capsys.readouterr()
    assert main(["compare", str(other), str(reference)]) == 2
    assert "holds a comparison: nothing to check" in capsys.readouterr().err


def test_a_comparison_without_a_paired_mean_on_one_side_says_so():
    ref = {"label": "inconclusive", "paired": {"mean": 0.1, "ci": 0.2}}
    new = {"label": "inconclusive", "paired": None}
    check = Check(("parity", "ddl", "resnet", "test"), ref, new)
    assert not check.reproduced and check.why == "no paired mean in the rerun"
    assert Check(check.key, new, ref).why == "no paired mean in the reference"
