"""A study page opens with its answer: each question in its own words, answered from the
labels alone and in the words each label allows."""

from pathlib import Path

import pytest
from test_finding import comparison, report

from ddl_dynamics.analysis.judge.verdicts import (
    AT_FLOOR,
    BOTH_SOLVED,
    EQUIVALENT,
    INCONCLUSIVE,
    LOSS,
    UNMATCHED_SIZE,
    WIN,
)
from ddl_dynamics.analysis.report import wording
from ddl_dynamics.publish.answer import OPENING, answer, answering
from ddl_dynamics.publish.publish import load_study, studies
from ddl_dynamics.publish.study_page import GENERATED, study_page

ROOT = Path(__file__).resolve().parents[1]


def _asked(question, model, control, tasks=()):
    return {
        "question": question,
        "model": model,
        "control": control,
        "tasks": list(tasks),
        "split": "test",
    }


def _study(*comparisons, questions=(), shipped=True):
    return {**report(*comparisons), "questions": list(questions), "shipped": shipped}


@pytest.mark.slow  # every shipped study judged again: in the slow run, which CI runs
def test_every_published_page_opens_with_its_generated_answer():
    for folder in studies(ROOT / "results"):
        page = (ROOT / "docs" / "studies" / f"{folder.name}.md").read_text()
        opening = page.split(GENERATED, 1)[1].strip().split("\n\n", 1)[0]
        assert opening == answer(load_study(folder)), folder.name
        assert opening.startswith(OPENING)


def test_a_declared_question_is_answered_in_its_words_with_each_labels_size():
    won = comparison("parity", "ddl", "ddl-write", WIN, paired={"mean": -0.205, "ci": 0.063})
    open_ = comparison("overwrite", "ddl", "ddl-write", INCONCLUSIVE, detectable=0.012)
    text = answer(
        _study(won, open_, questions=[_asked("Does the erase term help?", "ddl", "ddl-write")])
    )
    (line,) = [line for line in text.splitlines() if line.startswith("*Does")]
    assert line == (
        "*Does the erase term help?* `ddl` beats `ddl-write` on parity (by 0.205 "
        "± 0.063 mse); no difference detected between `ddl` and `ddl-write` on "
        "overwrite (detectable ±0.012)."
    )
    assert wording.effect_words(text) == [] and "equal" not in text and "no effect" not in text
    assert len(text.splitlines()) == 2  # the opening and the question: nothing else to answer


def test_an_inconclusive_test_without_a_detectable_size_says_why():
    few = comparison(
        "parity",
        "ddl",
        "ddl-write",
        INCONCLUSIVE,
        model_values=(1.0, 2.0),
        control_values=(2.0, 2.5),
    )
    text = answer(_study(few, questions=[_asked("Q?", "ddl", "ddl-write")]))
    assert text.splitlines()[1] == (
        "*Q?* No difference detected between `ddl` and "
        "`ddl-write` on parity (too few seeds for a test)."
    )


def test_losses_equivalence_and_untested_comparisons_are_said_as_such():
    asked = [
        _asked("Q1?", "ddl", "resnet", ["oscillator"]),
        _asked("Q2?", "ddl", "hc"),
        _asked("Q3?", "ddl", "mhc"),
        _asked("Q4?", "ddl", "ddl-bmax1"),
        _asked("Q5?", "ddl", "node"),
    ]
    text = answer(
        _study(
            comparison("oscillator", "ddl", "resnet", LOSS, paired={"mean": 0.0014, "ci": 0.00025}),
            comparison("parity", "ddl", "hc", BOTH_SOLVED),
            comparison("parity", "ddl", "mhc", AT_FLOOR),
            comparison("parity", "ddl", "ddl-bmax1", EQUIVALENT, p_adjusted=0.5),
            comparison("parity", "ddl", "node", UNMATCHED_SIZE),
            questions=asked,
        )
    )
    lines = text.splitlines()[1:]
    assert lines[0] == (
        "*Q1?* `ddl` does worse than `resnet` on oscillator (by 0.0014 ± 0.00025 mse)."
    )
    assert lines[1] == "*Q2?* `ddl` against `hc` on parity — both solved (a ceiling, no test)."
    assert lines[2] == "*Q3?* `ddl` against `mhc` on parity — both at floor (no test)."
    assert lines[3] == "*Q4?* `ddl` is equivalent to `ddl-bmax1` on parity (within ±0.5)."
    assert lines[4] == "*Q5?* `ddl` against `node` on parity — not tested: the sizes differ."


def test_other_findings_answer_the_findings_questions_with_the_delta_row_first():
    asked = comparison("parity", "ddl", "ddl-write", WIN)
    peer = comparison("overwrite", "hc", "ddl", WIN, paired={"mean": -0.5, "ci": 0.1})
    solved = comparison("depth-recall", "ddl", "resnet", BOTH_SOLVED, kinds=("baseline",))
    text = answer(
        _study(asked, peer, solved, questions=[_asked("Does erasing help?", "ddl", "ddl-write")])
    )
    lines = text.splitlines()
    assert lines[2] == "Peers: `ddl` does worse than `hc` on overwrite (by 0.5 ± 0.1 mse)."
    assert len(lines) == 3  # the asked test once; a comparison no test was drawn for not at all


def test_a_long_answer_counts_what_it_leaves_to_the_tables():
    wins = [
        comparison(f"task-{i}", f"ddl-{i}", "resnet", WIN, kinds=("baseline",)) for i in range(6)
    ]
    (line,) = answer(_study(*wins)).splitlines()[1:]
    assert line.startswith("Each row against its baseline: `ddl-0` beats `resnet` on task-0")
    assert line.endswith("; and 3 more findings (below).")


def test_a_study_without_its_cells_says_whose_rules_its_labels_follow():
    legacy = _study(comparison("parity", "ddl", "ddl-write", WIN), shipped=False)
    page = study_page(legacy, [])
    assert answer(legacy).endswith(
        "These are the labels of the rules it was published under (below)."
    )
    assert "**Published before studies shipped their cells**" in page
    assert answer(_study()).splitlines()[1] == "The study draws no comparison of two rows."


@pytest.mark.slow  # every shipped study judged again: in the slow run, which CI runs
def test_each_published_question_is_answered_by_its_own_labels():
    says = {
        WIN: "`{m}` beats `{c}` on",
        LOSS: "`{m}` does worse than `{c}` on",
        INCONCLUSIVE: "no difference detected between `{m}` and `{c}` on",
        UNMATCHED_SIZE: "not tested: the sizes differ",
    }
    checked = 0
    for folder in studies(ROOT / "results"):
        study = load_study(folder)
        for asked in study["questions"]:
            (line,) = [
                x
                for x in answer(study).splitlines()
                if x.startswith(f"*{asked['question'].strip()}*")
            ]
            for c in answering(study, asked):
                if c["label"] in says:
                    assert says[c["label"]].format(m=c["model"], c=c["control"]) in line.lower()
                    checked += 1
    assert checked > 10
