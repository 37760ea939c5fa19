"""The documentation's generated parts: made from results/ alone, worded by the labels, and
committed as ``ddl-dyn docs`` makes them."""

import json
import re
import shutil
from pathlib import Path

import pytest

from ddl_dynamics.analysis.judge.verdicts import INCONCLUSIVE, LABELS
from ddl_dynamics.analysis.report import wording
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.config import TrainConfig
from ddl_dynamics.publish.pages import config_block, task_block
from ddl_dynamics.publish.study_page import crossover_lines, natural, reproduce_line

ROOT = Path(__file__).resolve().parents[1]
#: What ``ddl-dyn docs`` reads and writes, copied for a regeneration.
DOC_PATHS = ("README.md", "mkdocs.yml", "docs", "results")


def _generated_pages(root: Path) -> dict[Path, str]:
    pages = [root / "README.md", *sorted((root / "docs" / "studies").glob("*.md"))]
    return {p: p.read_text() for p in pages}


def _tree(root: Path) -> dict[str, bytes]:
    found = {name: (root / name).read_bytes() for name in ("README.md", "mkdocs.yml")}
    for path in sorted((root / "docs").rglob("*")):
        if path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


@pytest.mark.slow  # every shipped study judged again: in the slow run, which CI runs
def test_docs_leave_a_clean_checkout_unchanged(tmp_path):
    for name in DOC_PATHS:
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    assert main(["docs", "--results", str(tmp_path / "results"), "--out", str(tmp_path)]) == 0
    before, after = _tree(ROOT), _tree(tmp_path)
    assert sorted(after) == sorted(before)
    assert [name for name in before if before[name] != after[name]] == []


def test_every_study_in_results_has_its_page_ending_with_its_reproduce_line():
    studies = sorted(p.name for p in (ROOT / "results").iterdir() if (p / "report.json").is_file())
    assert studies
    for name in studies:
        page = (ROOT / "docs" / "studies" / f"{name}.md").read_text()
        assert page.rstrip().splitlines()[-2] == reproduce_line(name)
        report = json.loads((ROOT / "results" / name / "report.json").read_text())
        for c in report["comparisons"]:  # every comparison's label is on the page
            assert f"| {c['model']} | {c['control']} |" in page


def test_generated_pages_put_no_effect_word_beside_an_inconclusive_comparison():
    for path, text in _generated_pages(ROOT).items():
        assert wording.effect_words(text) == [], path


def test_the_check_catches_an_effect_word_beside_an_inconclusive_comparison():
    record = {
        "task": "var-chain",
        "model": "ddl",
        "control": "transformer",
        "label": INCONCLUSIVE,
        "metric": "accuracy",
        "higher_is_better": True,
        "detectable": 0.06,
        "paired": {"seeds": [0, 1, 2, 3], "mean": -0.023, "ci": 0.063},
    }
    line = wording.sentence(record)
    assert wording.NO_DIFFERENCE in line and "detectable ±0.06" in line
    assert wording.effect_words(line) == []
    for word in wording.EFFECT_WORDS:
        assert wording.effect_words(f"{line} The delta update adds {word} here.") != []
    assert wording.effect_words("only one win; no difference elsewhere") == []
    assert wording.effect_words("commonly: no difference detected") == []  # in a word
    assert wording.effect_words("its write-only twin: no difference detected") == []


@pytest.mark.parametrize("label", [*LABELS, "a label of the future"])
def test_every_label_has_a_sentence_and_an_unknown_one_a_neutral_sentence(label):
    record = {
        "task": "parity",
        "model": "ddl",
        "control": "resnet",
        "label": label,
        "metric": "accuracy",
        "higher_is_better": True,
        "detectable": 0.05,
        "paired": {"seeds": [0, 1, 2], "mean": 0.4, "ci": 0.1, "margin": 0.01},
    }
    line = wording.sentence(record)
    assert line.startswith("`ddl` against `resnet` on parity (test accuracy ↑)")
    if label not in LABELS:
        assert f'"{label}"' in line
    untested = (
        "unequal budget",
        "unmatched size",
        "unequal tuning",
        "fails",
        "both solved",
        "both at floor",
        "equivalent",
    )  # equivalent: the 90% interval, not the CI
    assert ("+0.4 ± 0.1" in line) == (label not in untested)


def test_the_config_table_names_every_training_key_with_its_default():
    table = config_block()
    for name, field in TrainConfig.__dataclass_fields__.items():
        assert re.search(rf"^\| `{name}` \| .* \| `{field.default!r}` \|", table, re.M), name
    assert "| `steps` | int | `1000` | no | must be positive; more than" in table


def test_every_readme_link_resolves():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        assert (ROOT / link.split("#")[0]).exists(), link


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 12_288
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "CITATION.cff").is_file() and (ROOT / "docs" / "headline.png").is_file()
    for phrase in (
        "Nothing on `var-chain` is owed to the Delta update",
        "the gain is EC's, not the delta rule's",
        "the expanded state without EC adds nothing",
        "β > 1 matters only where the theory says it does",
        "β ≤ 1 changes nothing",
    ):
        for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
            assert phrase not in path.read_text(), (phrase, path)


def test_publish_and_docs_from_a_tiny_study(tiny_study, tmp_path):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    study = results / "tiny"
    assert sorted(p.name for p in study.iterdir()) == [
        "cells.csv",
        "experiment.toml",
        "figures",
        "record.json",
        "report.json",
        "run.json",
    ]
    assert "[[comparisons]]" in (study / "experiment.toml").read_text()
    assert json.loads((study / "run.json").read_text())["cells"] == 12
    assert {p.suffix for p in (study / "figures").iterdir()} == {".png"}
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    shutil.rmtree(tmp_path / "docs" / "studies", ignore_errors=True)
    assert main(["docs", "--results", str(results), "--out", str(tmp_path)]) == 0
    page = (tmp_path / "docs" / "studies" / "tiny.md").read_text()
    assert "a tiny study for the tests" in page and "## Findings" in page
    report = json.loads((study / "report.json").read_text())
    for c in report["comparisons"]:
        assert f"- {wording.sentence(c)}" in page
    # The declared question stands above the sentences of its comparisons, one per task.
    asked = page.split("## Questions", 1)[1].split("## Findings", 1)[0]
    assert "**Does the delta rule beat the additive stack here?**" in asked
    answers = [c for c in report["comparisons"] if (c["model"], c["control"]) == ("ddl", "resnet")]
    assert len(answers) == 2 and all(f"- {wording.sentence(c)}" in asked for c in answers)
    assert (tmp_path / "docs" / "studies" / "tiny" / "compare.png").is_file()
    assert "(docs/studies/index.md)" in (tmp_path / "README.md").read_text()
    assert "(tiny.md)" in (tmp_path / "docs" / "studies" / "index.md").read_text()
    assert "      - studies/tiny.md\n" in (tmp_path / "mkdocs.yml").read_text()
    assert "studies/regimes.md" not in (tmp_path / "mkdocs.yml").read_text()
    assert not (tmp_path / "docs" / "studies" / "regimes.md").exists()  # a study gone: page gone
    figure = (tmp_path / "docs" / "headline.png").read_bytes()
    assert main(["docs", "--results", str(results), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "headline.png").read_bytes() == figure


def test_a_studys_changes_survive_publishing_again_and_close_its_page(tiny_study, tmp_path):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    (results / "tiny" / "changes.md").write_text("One label changed: `ddl` against `resnet`.\n")
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    assert (results / "tiny" / "changes.md").read_text().startswith("One label changed")
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, tmp_path / name)
    assert main(["docs", "--results", str(results), "--out", str(tmp_path)]) == 0
    page = (tmp_path / "docs" / "studies" / "tiny.md").read_text()
    changes = page.split("## Changes from earlier runs", 1)[1].split("## Reproduce", 1)[0]
    assert changes.strip() == "One label changed: `ddl` against `resnet`."


def test_task_labels_order_by_the_numbers_in_them():
    labels = ["s[p=0.5]", "s[p=1]", "s[p=0]", "s[p=0.05]", "s[p=0.25]", "r"]
    assert sorted(labels, key=natural) == [
        "r",
        "s[p=0]",
        "s[p=0.05]",
        "s[p=0.25]",
        "s[p=0.5]",
        "s[p=1]",
    ]


def test_the_crossover_table_gives_each_knob_values_label_and_the_crossover():
    def point(label):
        return {"label": label, "detectable": 0.5 if label == INCONCLUSIVE else None}

    crossing = {
        "setting": {"family": "switched", "knob": "p", "label": "event=reflect"},
        "model": "ddl",
        "control": "resnet",
        "star": 0.5,
        "interval": [0.25, None],
        "points": [[1.0, point("win")], [0.0, point("loss")], [0.5, point("win")]],
    }
    never = {
        **crossing,
        "model": "gated",
        "star": None,
        "interval": None,
        "points": [[0.0, point(INCONCLUSIVE)], [1.0, point("equivalent")]],
    }
    lines = crossover_lines({"crossovers": [crossing, never]})
    assert lines[0] == "### switched: the crossover over p"
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == (
        "| setting | model − control | crossover | interval | p = 0 | p = 0.5 | p = 1 |"
    )
    assert table[2] == (
        "| event=reflect | ddl − resnet | p* = 0.5 | [0.25, none] | loss | win | win |"
    )
    assert table[3] == (
        "| event=reflect | gated − resnet | none in range | — | "
        "inconclusive (detectable ±0.5) | — | equivalent |"
    )


def test_docs_without_results_is_bad_input(tmp_path, capsys):
    assert main(["docs", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "no results folder" in capsys.readouterr().err


def test_the_task_attribute_table_says_what_every_attribute_means():
    table = task_block().split("\n\n")[0].splitlines()[2:]
    said = {row.split(" | ")[0].strip("| `"): row.rsplit(" | ", 1)[1] for row in table}
    for name in (
        "depth",
        "loss_name",
        "metric_name",
        "ood_splits",
        "expectations",
        "check_split(split)",
        "split_steps(split)",
    ):
        assert name in said and said[name].strip(" |") not in ("", "—"), name


def test_a_long_table_on_a_study_page_is_folded_and_a_short_one_is_not():
    from ddl_dynamics.publish.study_page import FOLD_ROWS, folded_table

    rows = [[str(i), "x"] for i in range(FOLD_ROWS + 1)]
    long, short = (
        folded_table("Every row", ["a", "b"], rows),
        folded_table("Some", ["a", "b"], rows[:-1]),
    )
    assert long[0] == f'<details markdown="1"><summary>Every row: {FOLD_ROWS + 1} rows</summary>'
    assert long[-1] == "</details>" and "| 0 | x |" in long
    assert not any("<details" in line for line in short) and "| 0 | x |" in short
