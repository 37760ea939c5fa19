"""The finding: each distinct test once, grouped by question, the Delta row first; the
headline figure that draws it; the sentences that state an equivalence."""

from collections import Counter

import pytest
from PIL import Image

from ddl_dynamics.analysis.judge.verdicts import (
    AT_FLOOR,
    BOTH_SOLVED,
    EQUIVALENT,
    INCONCLUSIVE,
    LOSS,
    WIN,
)
from ddl_dynamics.analysis.report import wording
from ddl_dynamics.publish import finding
from ddl_dynamics.publish.front import headline_figure, index_page, readme_block
from ddl_dynamics.publish.study_page import study_page


def comparison(
    task,
    model,
    control,
    label,
    model_values=(1.0, 2.0, 3.0),
    control_values=(2.0, 3.0, 4.5),
    kinds=("declared",),
    **extra,
):
    """A comparison in the report.json shape (lower is better: an MSE)."""
    pairs = [[s, m, c] for s, (m, c) in enumerate(zip(model_values, control_values, strict=True))]
    diffs = [m - c for _, m, c in pairs]
    paired = {
        "seeds": list(range(len(pairs))),
        "differences": diffs,
        "mean": sum(diffs) / len(diffs),
        "ci": 0.1,
        "margin": 0.5,
        "pairs": pairs,
        "failed": [],
        "control_failed": [],
        "both_failed": [],
        "test": "paired t",
        "interval": [min(diffs), max(diffs)],
    }
    paired.update(extra.pop("paired", {}))
    return {
        "task": task,
        "model": model,
        "control": control,
        "split": "test",
        "kinds": list(kinds),
        "metric": "mse",
        "higher_is_better": False,
        "label": label,
        "paired": paired,
        "p_adjusted": extra.pop("p_adjusted", 0.01),
        "detectable": extra.pop("detectable", None),
        "note": "",
        "asked_split": "",
        **extra,
    }


def report(*comparisons, name="study", crossovers=(), tables=()):
    return {
        "name": name,
        "comparisons": list(comparisons),
        "crossovers": list(crossovers),
        "tables": list(tables),
        "questions": [],
    }


def test_two_comparisons_with_the_same_per_seed_data_are_one_test():
    one = comparison("switched[event=overwrite,p=0]", "ddl", "resnet", WIN)
    two = comparison("switched[event=reflect,p=0]", "ddl", "resnet", WIN)
    other = comparison(
        "switched[event=reflect,p=0]", "ddl", "resnet", WIN, model_values=(1.0, 2.0, 3.5)
    )
    found, left = finding.study_findings(report(one, two, other))
    assert len(found) == 2 and left == Counter({finding.REPEAT: 1})
    # asked on another split and judged on test: the same pairs, the same test
    moved = {**one, "asked_split": "long", "kinds": ["declared"]}
    assert len(finding.study_findings(report(one, moved))[0]) == 1


def test_a_crossover_is_one_finding_stated_with_its_crossover_and_interval():
    points = [
        [
            p,
            comparison(
                f"switched[p={p:g}]", "ddl", "ddl-write", label, model_values=(1.0, 2.0, 3.0 + p)
            ),
        ]
        for p, label in ((0.0, INCONCLUSIVE), (0.5, WIN), (1.0, WIN))
    ]
    crossing = {
        "setting": {"family": "switched", "knob": "p", "label": "event=overwrite"},
        "model": "ddl",
        "control": "ddl-write",
        "star": 0.5,
        "interval": [0.5, None],
        "points": points,
    }
    found, _ = finding.study_findings(report(*(c for _, c in points), crossovers=[crossing]))
    assert len(found) == 1
    (only,) = found
    assert only.question == finding.ERASE and only.label == WIN
    assert only.text == (
        "`ddl` beats `ddl-write` on switched[event=overwrite] (study) from "
        "p* = 0.5 on (95% interval [0.5, none])"
    )
    assert len(finding.points(only)) == 3  # the figure draws every knob value


def test_a_ddl_win_over_hc_reads_with_ddl_first():
    c = comparison(
        "sign-flip-reflect",
        "hc",
        "ddl",
        LOSS,
        model_values=(3.0, 4.0, 5.0),
        control_values=(1.0, 2.0, 3.0),
    )
    found, _ = finding.findings([report(c)])
    assert found[0].text == "`ddl` beats `hc` on sign-flip-reflect (study)"
    assert found[0].question == finding.PEERS and found[0].label == WIN
    text = "\n".join(finding.summary(found, {}))
    assert "- **Where a Delta row wins**\n  - peers: `ddl` beats `hc`" in text
    assert "`hc` against `ddl`" not in text and "loss for" not in text
    # drawn on the side of ddl: positive, ddl better
    assert finding.points(found[0]) == [(pytest.approx(4.0), WIN)]


def test_every_row_against_its_baseline_counts_and_a_loss_to_resnet_is_named():
    wins = [
        comparison(t, m, "resnet", WIN, kinds=("baseline",), model_values=(1.0, 2.0, 3.0 + i / 10))
        for i, (t, m) in enumerate(
            (t, m) for t in ("overwrite", "depth-recall", "switched") for m in ("ddl", "gated")
        )
    ]
    wins.append(comparison("sign-flip", "anode", "node", WIN, kinds=("baseline",)))
    lost = comparison(
        "oscillator",
        "ddl",
        "resnet",
        LOSS,
        kinds=("baseline",),
        model_values=(3.0, 4.0, 5.0),
        control_values=(1.0, 2.0, 3.0),
    )
    same = comparison(
        "parity", "ddl-tied", "resnet-tied", EQUIVALENT, kinds=("baseline",), p_adjusted=1.0
    )
    found, _ = finding.findings([report(*wins, lost, same)])
    assert Counter(f.label for f in found) == {WIN: 7, LOSS: 1, EQUIVALENT: 1}
    assert {f.question for f in found} == {finding.BASELINE}
    text = "\n".join(finding.summary(found, {}))
    assert (
        "- **Where a Delta row loses**\n  - each row against its baseline: `ddl` does worse "
        "than `resnet` on oscillator" in text
    )


def test_untested_comparisons_and_implementation_checks_are_outside_the_counts():
    solved = comparison(
        "parity", "ddl", "resnet", BOTH_SOLVED, model_values=(1.0,) * 3, control_values=(1.0,) * 3
    )
    floor = comparison(
        "var-chain[hops=3]",
        "ddl-dv1",
        "transformer",
        AT_FLOOR,
        model_values=(0.625,) * 3,
        control_values=(0.625,) * 3,
    )
    check = comparison("var-chain[hops=2]", "ddl-vmap-dv1", "ddl-dv1", LOSS)
    kept = comparison("overwrite", "ddl", "ddl-write", WIN)
    found, left = finding.findings([report(solved, floor, check, kept)])
    assert [f.label for f in found] == [WIN]
    assert left == Counter({BOTH_SOLVED: 1, AT_FLOOR: 1, finding.CHECK: 1})
    assert (
        "1 both at floor, 1 both solved, 1 implementation check" in finding.summary(found, left)[0]
    )


def test_an_equivalence_with_a_significant_difference_is_not_listed_as_equivalent():
    both = comparison(
        "sign-flip-reflect",
        "ddl-product",
        "ddl",
        EQUIVALENT,
        p_adjusted=0.005,
        model_values=(2.1, 3.1, 4.1),
        control_values=(2.0, 3.0, 4.0),
    )
    plain = comparison(
        "overwrite",
        "ddl-decoupled",
        "ddl",
        EQUIVALENT,
        p_adjusted=0.8,
        model_values=(2.0, 3.1, 4.0),
        control_values=(2.0, 3.0, 4.0),
    )
    found, _ = finding.findings([report(both, plain)])
    assert Counter(f.label for f in found) == {finding.WITHIN_MARGIN: 1, EQUIVALENT: 1}
    (listed,) = [s for s in finding.summary(found, {}) if s.startswith("- **Equivalent")]
    (within,) = [s for s in finding.summary(found, {}) if s.startswith("- **Significantly")]
    assert "`ddl-decoupled` is equivalent to `ddl`" in listed and "ddl-product" not in listed
    assert (
        "`ddl-product` does worse than `ddl` on sign-flip-reflect (study), by less than "
        "the margin ±0.5"
    ) in within


@pytest.mark.parametrize(
    ("model", "control", "baseline", "asked"),
    [
        ("ddl", "ddl-write", False, finding.ERASE),
        ("ddl-dv4", "additive-dv4", False, finding.ERASE),
        ("ddl-tied", "ddl-tied-bmax1", False, finding.BETA),
        ("ddl-dv4", "ddl-dv4-repeat", False, finding.STATE),
        ("ddl-dv4-repeat", "ddl-dv1", False, finding.STATE),
        ("additive-dv4", "transformer-ec", False, finding.STATE),
        ("hc", "ddl", False, finding.PEERS),
        ("mhc", "hc", False, finding.PEERS),
        ("ddl-product-tied", "ddl-tied", False, finding.PEERS),
        ("ddl-product-dv1", "ddl-dv1", False, finding.PEERS),
        ("anode", "node", False, finding.DEPTH),
        ("ddl", "resnet", True, finding.BASELINE),
        ("hc", "resnet", True, finding.BASELINE),
        ("ddl-dv4", "additive-dv4", True, finding.ERASE),  # a twin as the baseline: its question
        ("transformer-ec", "transformer", True, finding.STATE),
        ("hc", "ddl", True, finding.BASELINE),  # a peer as the baseline: each row against it
        ("ddl-lin", "ddl-tied", False, finding.OTHER),
        ("ddl-vmap-dv1", "ddl-dv1", False, None),
        ("ddl-vmap-dv1", "transformer", True, finding.BASELINE),
    ],
)
def test_each_comparison_answers_the_question_its_rows_name(model, control, baseline, asked):
    assert finding.question(model, control, baseline) == asked


def test_an_equivalent_sentence_gives_the_90_interval_and_a_binding_floor():
    c = comparison(
        "switched[p=0]",
        "ddl-product",
        "ddl",
        EQUIVALENT,
        p_adjusted=1.0,
        model_values=(5e-5, 6e-5, 7e-5),
        control_values=(4e-5, 5e-5, 6e-5),
        paired={"margin": 1e-3, "ci": 0.0031, "interval": [-2e-5, 4e-5]},
    )
    line = wording.sentence(c)
    assert "equivalent within the absolute floor ±0.001 = 17–20× the means" in line
    assert "90% interval [-2e-05, +4e-05]" in line and "0.0031" not in line
    assert "significantly" not in line
    wide = comparison(
        "overwrite", "ddl", "resnet", EQUIVALENT, p_adjusted=1.0, paired={"margin": 0.5}
    )
    assert "floor" not in wording.sentence(wide)
    significant = {**c, "p_adjusted": 0.004}
    assert wording.sentence(significant).endswith(
        "; yet significantly worse, by less than the margin (Holm p = 0.004)."
    )


def test_sentences_give_the_finished_pairs_beside_the_seeds_run():
    c = comparison(
        "overwrite",
        "ddl",
        "resnet",
        WIN,
        paired={"seeds": [0, 1, 2, 3, 4, 5], "failed": [6], "control_failed": [7]},
    )
    assert "n = 6 of 8" in wording.sentence(c)
    assert "n = 3)" in wording.sentence(comparison("overwrite", "ddl", "resnet", WIN))


def test_an_inconclusive_signed_rank_test_never_says_the_differences_do_not_vary():
    c = comparison(
        "overwrite",
        "ddl",
        "resnet",
        INCONCLUSIVE,
        p_adjusted=0.3,
        paired={"test": "signed rank, failures last"},
    )
    line = wording.sentence(c)
    assert "do not vary" not in line and "exact test (signed rank, failures last)" in line


def test_the_headline_is_at_most_1600_px_tall_and_redrawn_only_when_its_data_change(tmp_path):
    many = [
        comparison(
            f"task-{i}",
            f"ddl-{i % 40}",
            "resnet",
            (WIN, LOSS, INCONCLUSIVE, EQUIVALENT)[i % 4],
            kinds=("baseline",),
            model_values=(1.0, 2.0, 3.0 + i / 100),
        )
        for i in range(400)
    ]
    reports = [report(*many, name="big")]
    path = headline_figure(reports, tmp_path / "headline.png")
    with Image.open(path) as image:
        assert image.size[1] <= 1600
    drawn = path.read_bytes()
    assert headline_figure(reports, path).read_bytes() == drawn
    many[0] = {**many[0], "paired": {**many[0]["paired"], "mean": -4.0}}
    assert headline_figure([report(*many, name="big")], path).read_bytes() != drawn


def test_the_readme_block_groups_by_question_and_counts_each_study_once():
    one = comparison(
        "switched[event=overwrite,p=0]", "ddl", "resnet", WIN, kinds=("baseline",), chosen="lr=0.01"
    )
    two = {**one, "task": "switched[event=reflect,p=0]"}
    tables = [
        {"task": one["task"], "rows": [{"model": "ddl", "chosen": "lr=0.01", "baseline": "resnet"}]}
    ]
    judged = {**report(one, two, name="tuned", tables=tables), "shipped": True}
    reports = [judged, {**judged, "name": "legacy", "shipped": False}]
    text = readme_block(reports)
    assert "1 distinct finding: 1 win" in text and "1 repeat of a counted test" in text
    assert "over 1 tuned study judged from the cells it ships" in text
    assert "In the Transformer" not in text  # no study of Transformers
    index = index_page(reports)
    assert "- **each row against its baseline**: 1 win" in index
    assert "- [`tuned`](tuned.md): 1 win." in index
    # a study without its cells keeps its labels on its page, outside the finding
    assert "- [`legacy`](legacy.md): 1 win (published without its cells" in index


def test_the_readme_digests_the_transformer_studies_and_the_index_answers_their_questions():
    asked = "Does the delta rule help? ddl-dv1 against its write-only twin."
    c = comparison("char-lm", "ddl-dv1", "ddl-write-dv1", WIN)
    wide, tight = (
        comparison(
            f"char-lm[n={n}]",
            "ddl-dv1",
            "ddl-write-dv1",
            INCONCLUSIVE,
            model_values=(1.0, 2.0, 3.0 + n / 10),
            detectable=detectable,
        )
        for n, detectable in ((3, 0.3), (4, 0.02))
    )
    solved = comparison("char-lm[n=2]", "ddl-dv1", "ddl-write-dv1", "both solved")
    question = {"question": asked, "model": "ddl-dv1", "control": "ddl-write-dv1"}
    question |= {"tasks": [], "split": "test"}
    config = '[[tasks]]\nname = "char-lm"\n'
    tables = [{"task": "char-lm", "rows": [{"model": "ddl-dv1", "chosen": "lr=0.01"}]}]
    study = {
        **report(c, wide, tight, solved, name="lm", tables=tables),
        "questions": [question],
        "shipped": True,
        "experiment": {"config": config},
    }
    text = readme_block([study])
    assert "In the Transformer (1 study), question by question" in text
    digest = (
        "- **the erase term**: 1 win, 2 inconclusive. `ddl-dv1` beats `ddl-write-dv1` on "
        "char-lm (lm). The closest look: `ddl-dv1` against `ddl-write-dv1` on char-lm[n=4] "
        "(lm): inconclusive (detectable ±0.02)."
    )
    assert digest in text and "both solved" not in text.split("In the Transformer")[1]
    index = index_page([study])
    assert "- [`lm`](lm.md): *Does the delta rule help?* `ddl-dv1` beats " in index
    vector = {**study, "experiment": {"config": config.replace("char-lm", "parity")}}
    assert "In the Transformer" not in readme_block([vector])


def test_a_declared_question_is_answered_by_labels_alone():
    c = comparison("oscillator", "ddl-product", "resnet", WIN)
    r = {
        **report(c, name="peers"),
        "questions": [
            {
                "question": "A rotation is two reflections: does a second step remove the loss?",
                "model": "ddl-product",
                "control": "resnet",
                "tasks": ["oscillator"],
                "split": "test",
            }
        ],
    }
    page = study_page(r, [])
    asked = page.split("## Questions", 1)[1].split("## Findings", 1)[0]
    answers = [line for line in asked.splitlines() if line.startswith("- ")]
    assert answers == [f"- {wording.sentence(c)}"]
    assert "no premise or mechanism a question names is tested" in asked
    assert "remove" not in page.split("## Findings", 1)[1]
