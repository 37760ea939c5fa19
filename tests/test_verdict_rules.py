"""The rule book's edge cases, each from result rows built in memory: the lr choice, ties
and ceilings, the pairs a label needs, tuning and budgets, margins and ``requires`` on the
compared split, non-finite metrics, the Holm family, and what the verdict text shows."""

import math

import numpy as np
import pytest
from scipy import stats

import ddl_dynamics as dd
from ddl_dynamics.analysis.judge.comparisons import Request, judge
from ddl_dynamics.analysis.judge.stats import (
    ALPHA,
    PAIRED_T,
    SIGN_FLIP,
    Paired,
    detectable_difference,
    holm,
)
from ddl_dynamics.analysis.judge.verdicts import claim_verdict, seed_values
from ddl_dynamics.analysis.render.formats import render
from ddl_dynamics.analysis.report.text import comparison_cells
from ddl_dynamics.analysis.run import run_of

BASE8 = [0.50, 0.55, 0.52, 0.48, 0.51, 0.53, 0.49, 0.56]
BETTER8 = [v + 0.3 + 0.01 * (-1) ** s for s, v in enumerate(BASE8)]


def cell(
    model,
    seed,
    test,
    status="ok",
    task="parity",
    higher=True,
    params=100,
    long=None,
    val=None,
    train=None,
    tune=None,
    spec=None,
    **metrics,
):
    """One finished (or failed: empty metrics) cell of ``model`` on ``task``."""
    config = {"task": task.split("[")[0], "spec": spec or {}, "train": train or {}}
    if tune:
        config["tune"] = tune
    found = (
        {}
        if status == "failed"
        else {
            "metric": "accuracy" if higher else "mse",
            "higher_is_better": higher,
            "test": test,
            "val": test if val is None else val,
            "train": test,
            "ood": {"long": long},
            **metrics,
        }
    )
    suffix = "".join(f"-{k}{v}" for k, v in sorted((train or {}).items()))
    return dd.RunResult(
        status=status,
        key=f"{task}-{model}-{seed}{suffix}",
        task=task,
        model=model,
        seed=seed,
        params=params,
        config=config,
        metrics=found,
    )


def row(model, values, **kwargs):
    return [cell(model, s, v, **kwargs) for s, v in enumerate(values)]


def report(rows, config=""):
    return dd.build_report(run_of(rows, experiment={"config": config} if config else {}))


def found(rep):
    return {(c.model, c.control_text, c.split): c for c in rep.comparisons}


# --- 1. the lr choice


def tuned_row(model, val_by_lr, failed_by_lr, **kwargs):
    """A row tuned over lr, every seed at one val per lr, the named seeds failed there."""
    grid = {"lr": sorted(val_by_lr)}
    return [
        cell(
            model,
            s,
            val,
            status="failed" if s in failed_by_lr[lr] else "ok",
            train={"lr": lr},
            tune=grid,
            **kwargs,
        )
        for lr, val in val_by_lr.items()
        for s in range(8)
    ]


@pytest.mark.parametrize("failed", [{1e-3: {0}, 1e-2: {3}}, {1e-3: {0}, 1e-2: {0}}])
def test_the_lr_choice_reads_the_direction_from_the_task_not_a_failed_cell(failed):
    """Val 0.99 at lr 1e-3 and 0.57 at 1e-2 on an accuracy task: 1e-3, whichever seed failed
    where (a failed cell has no metrics to say which way is better)."""
    rows = tuned_row("ddl", {1e-3: 0.99, 1e-2: 0.57}, failed)
    assert run_of(rows).rows["parity", "ddl"].chosen_text() == "lr=0.001 (grid edge)"
    # an MSE task reads the other way
    mse = tuned_row("ddl", {1e-3: 0.99, 1e-2: 0.57}, failed, task="oscillator", higher=False)
    assert run_of(mse).rows["oscillator", "ddl"].chosen_text() == "lr=0.01 (grid edge)"


def test_a_cap_on_test_data_fails_that_split_alone_and_never_steers_the_choice():
    rows = tuned_row("ddl", {1e-3: 0.9, 1e-2: 0.95}, {1e-3: set(), 1e-2: set()}, long=0.8)
    for r in rows:  # the best rate hit the solver cap on the OOD split of one seed
        if r.config["train"]["lr"] == 1e-2 and r.seed == 2:
            r.metrics["ood"]["long"] = None
            r.metrics["capped"] = {"long": "solver cap of 100 steps"}
    chosen = run_of(rows).rows["parity", "ddl"]
    assert chosen.chosen_text() == "lr=0.01 (grid edge)"
    assert seed_values(chosen.selected, "long")[2] is None  # a failure there, not left out
    assert seed_values(chosen.selected, "test")[2] == 0.95  # the trained split finished


@pytest.mark.parametrize(
    ("val_by_lr", "text"),
    [
        ({1e-3: 0.6, 3e-3: 0.7, 1e-2: 0.9}, "lr=0.01 (grid edge)"),
        ({1e-3: 0.9, 3e-3: 0.7, 1e-2: 0.6}, "lr=0.001 (grid edge)"),
        ({1e-3: 0.6, 3e-3: 0.9, 1e-2: 0.7}, "lr=0.003"),
        ({1e-3: 0.6, 1e-2: 0.9}, "lr=0.01 (grid edge)"),  # two values: every choice is an end
        # grown past its declared end (the extension cells keep the declared grid)
        (
            {1e-3: 0.6, 3e-3: 0.7, 1e-2: 0.8, 0.0333: 0.85, 0.111: 0.9},
            "lr=0.111 (grid edge after 2 extensions)",
        ),
        ({1e-3: 0.6, 3e-3: 0.7, 1e-2: 0.8, 0.0333: 0.9, 0.111: 0.7}, "lr=0.0333"),
    ],
)
def test_a_choice_at_an_end_of_the_grid_says_so(val_by_lr, text):
    """charlm's first grid stopped at every row's choice, 1e-2; a wider one moved two rows
    and changed a label: a row's best may lie beyond the grid, and the report marks it."""
    rows = tuned_row("ddl", val_by_lr, {lr: set() for lr in val_by_lr})
    declared = [1e-3, 3e-3, 1e-2] if len(val_by_lr) > 3 else list(val_by_lr)
    for r in rows:
        r.config["tune"] = {"lr": declared}
    chosen = run_of(rows).rows["parity", "ddl"]
    assert chosen.chosen_text() == text
    assert chosen.at_grid_edge == ("grid edge" in text)


# --- 2. ties and ceilings


def test_ties_are_decided_by_the_exact_test():
    """1.0 against 1.0 on every seed but one at 0.999, and a constant gap: differences that
    do not vary get no t statistic (its p of 0 would survive any family), but the exact
    sign-flip test, whose p cannot fall below 2/2⁸."""
    ones = dict.fromkeys(range(8), 1.0)
    near = Paired.of({**ones, 0: 0.999}, ones, True, margin=0.01)
    assert near.test == PAIRED_T and near.p == pytest.approx(2 * stats.t.sf(1, 7))
    gap = Paired.of(dict.fromkeys(range(8), 0.9), dict.fromkeys(range(8), 0.6), True, margin=0.01)
    assert gap.test == SIGN_FLIP and gap.p == gap.floor == 2 / 2**8
    assert gap.tost == 1.0 and gap.tost_floor == 2**-8


def test_three_seeds_at_one_against_0_999_do_not_win():
    """Before: "win", on a t-test p of 0 for differences that do not vary."""
    rows = row("resnet", [0.999] * 3) + row("ddl", [1.0] * 3)
    [c] = report(rows).comparisons
    assert c.paired.test == SIGN_FLIP and c.paired.p == 0.25
    assert c.label == "inconclusive" and c.p_adjusted is None
    assert "cannot fall below 0.25" in c.note


@pytest.mark.parametrize(
    ("model", "control", "tie", "moved"),
    [
        (0.9, 0.9, "inconclusive", "equivalent"),  # the exact TOST's floor 2⁻⁸ > 0.05/29
        (0.9, 0.6, "inconclusive", "win"),  # the exact test's floor 2/2⁸ > 0.05/29
        (0.6, 0.9, "inconclusive", "loss"),
        (1.0, 1.0, "both solved", "equivalent"),  # a ceiling left by one seed is none
    ],
)
def test_a_tie_in_a_large_family_is_out_of_it_until_its_differences_vary(
    model, control, tie, moved
):
    """In a report of 30 tests at 8 seeds: a tie's exact test cannot reach its Holm level
    (Tarone), so it stays out of the family; one seed moved by 1e-3 gives the t-test real
    spread, and the label its direction."""
    rows = row("resnet", [control] * 8)
    for name in range(29):  # 29 more tests, each a clear win
        rows += row(f"w{name}", BETTER8)
    for shift, expected in ((0.0, tie), (1e-3, moved)):
        rep = report([*rows, *row("m", [model - shift] + [model] * 7)])
        assert rep.tests == (30 if shift else 29)
        assert found(rep)["m", "resnet", "test"].label == expected, shift


def test_ceilings_read_both_solved_and_stay_outside_the_family():
    """Three ceiling pairs of 8 seeds (before: "equivalent (n = 8)" in a 3-test report)."""
    rows = row("resnet", [1.0] * 8)
    for name in ("a", "b", "c"):
        rows += row(name, [1.0] * 8)
    rep = report(rows)
    assert {c.label for c in rep.comparisons} == {"both solved"}
    assert all(c.p_adjusted is None and c.tost_adjusted is None for c in rep.comparisons)
    assert rep.tests == 0 and "| both solved (n = 8) |" in render(rep)
    # beside a real test they do not enlarge its family
    rep = report(rows + row("d", BETTER8))
    d = found(rep)["d", "resnet", "test"]
    assert rep.tests == 1 and d.p_adjusted == pytest.approx(d.paired.p)
    # an MSE ceiling is 0 on every seed
    mse = row("resnet", [0.0] * 4, task="oscillator", higher=False)
    mse += row("ddl", [0.0] * 4, task="oscillator", higher=False)
    assert {c.label for c in report(mse).comparisons} == {"both solved"}


# --- 3. the pairs a label needs


def test_three_finished_pairs_are_needed_and_the_label_counts_them():
    """Two finished pairs and six seeds both rows failed: "fails", never a win or an
    equivalence on the seeds compared (before: "win (n = 8)")."""
    control = row("resnet", [0.5, 0.52] + [None] * 6)
    model = row("ddl", [0.9, 0.91] + [None] * 6)
    for r in control[2:] + model[2:]:
        r.status, r.metrics = "failed", {}
    rep = report(control + model)
    [c] = rep.comparisons
    assert c.label == "fails" and (c.paired.n, c.paired.total) == (2, 8)
    assert "| ddl fails 6/8; resnet fails 6/8 |" in render(rep)
    # with a third pair the test is drawn, and the label counts the finished pairs
    control[2] = cell("resnet", 2, 0.51)
    model[2] = cell("ddl", 2, 0.92)
    [c] = report(control + model).comparisons
    assert c.paired.n == 3 and "(n = 3 of 8" in render(report(control + model))


# --- 4. tuning and budgets


def test_one_sided_or_unequal_tuning_gets_no_test():
    fixed = row("resnet", BASE8, train={"lr": 3e-3})
    tuned = [
        cell("ddl", s, v, train={"lr": lr}, tune={"lr": [1e-3, 1e-2]}, val=0.9 - lr)
        for lr in (1e-3, 1e-2)
        for s, v in enumerate(BETTER8)
    ]
    [c] = report(fixed + tuned).comparisons
    assert c.label == "unequal tuning" and c.paired is None
    assert "ddl searched lr=0.001/0.01; resnet none" in c.note
    six = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
    wide = [
        cell("resnet", s, v, train={"lr": lr}, tune={"lr": six})
        for lr in six
        for s, v in enumerate(BASE8)
    ]
    [c] = report(wide + tuned).comparisons
    assert c.label == "unequal tuning"
    same = [
        cell("resnet", s, v, train={"lr": lr}, tune={"lr": [1e-3, 1e-2]})
        for lr in (1e-3, 1e-2)
        for s, v in enumerate(BASE8)
    ]
    assert report(same + tuned).comparisons[0].label == "win"


@pytest.mark.parametrize(
    ("change", "flagged"),
    [
        ({"ode_max_steps": 50}, True),  # the solver's budget, between two ODE rows
        ({"bf16": True}, False),  # ignored on the CPU
        ({"eval_every": 10}, False),  # only watches training
        ({"max_seconds": 60.0}, False),  # a safety net, not a budget
        ({"compile": True}, False),  # how the steps run, compiled or eager
    ],
)
def test_budget_fields_that_set_work_are_compared_and_the_rest_are_not(change, flagged):
    train = {
        "steps": 100,
        "ode_max_steps": 100,
        "bf16": False,
        "eval_every": 50,
        "max_seconds": None,
        "device": "cpu",
    }
    rows = row("node", BASE8, train=train, nfe_test=20.0)
    rows += row("node-aug", BETTER8, train={**train, **change}, nfe_test=20.0)
    rows[8].config["baseline"] = "node"
    [c] = [c for c in report(rows).comparisons if c.model == "node-aug"]
    assert (c.label == "unequal budget") == flagged


def test_the_size_gate_is_the_same_whichever_row_is_the_control():
    rows = row("a", BASE8, params=111) + row("b", BETTER8, params=100)
    config = (
        '[[comparisons]]\nmodel = "a"\ncontrol = "b"\n[[comparisons]]\nmodel = "b"\ncontrol = "a"\n'
    )
    labels = {c.label for c in report(rows, config).comparisons}
    assert labels == {"unmatched size"}


@pytest.mark.parametrize(
    "params, flops, label",
    [
        (150, 2e6, "win"),  # larger in both: tested, the model wins
        (150, 5e5, "unmatched size"),  # fewer FLOPs: not larger, so not tested
        (90, 2e6, "unmatched size"),  # fewer parameters
    ],
)
def test_a_control_declared_larger_is_tested_where_it_is_larger_in_both(params, flops, label):
    rows = row("a", BETTER8, params=100) + row("b", BASE8, params=params)
    for r in rows:
        r.flops = 1e6 if r.model == "a" else flops
    config = '[[comparisons]]\nmodel = "a"\ncontrol = "b"\ncontrol_larger = true\n'
    [c] = [c for c in report(rows, config).comparisons if c.model == "a"]
    assert c.label == label
    if label == "win":
        assert c.note.startswith("control larger on purpose: 1.50× the parameters, 2.00×")
    # Undeclared, the same rows are not of a size.
    [c] = report(rows, config.replace("control_larger = true\n", "")).comparisons
    assert c.label == "unmatched size"


# --- 5. margins on the compared split; 6. requires


def oscillator_rows(shift):
    """Two MSE rows that fit the trained split (test ≈ 0.001) and extrapolate to ≈ 0.52 on
    ``long``, the model ``shift`` off the control, give or take 0.003 per seed."""
    noise = [0.003 * (-1) ** s * (1 + s % 3) for s in range(8)]
    base = [0.52 + 0.01 * (s % 4) for s in range(8)]
    kwargs = {"task": "oscillator", "higher": False}
    rows = [cell("resnet", s, 0.001, long=b, **kwargs) for s, b in enumerate(base)]
    rows += [
        cell("ddl", s, 0.001, long=b + shift + n, **kwargs)
        for s, (b, n) in enumerate(zip(base, noise, strict=True))
    ]
    return rows


def test_the_margin_comes_from_the_compared_split():
    """Before: the margin came from the test MSE (1e-4), and a 0.1% difference on ``long``
    was no equivalence."""
    config = '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\nrequires = 0.01\n'
    c = found(report(oscillator_rows(0.0005), config))["ddl", "resnet", "long"]
    long = np.mean([0.52 + 0.01 * (s % 4) for s in range(8)])
    assert c.paired.margin == pytest.approx(0.1 * long)
    assert c.label == "equivalent"


def test_the_margin_is_the_same_whichever_row_is_the_control():
    """MSE 0.5 against 0.553: 10% of 0.553 is 0.0553, of 0.5 only 0.05. Before, a vs b read
    "equivalent" and b vs a "loss"; the margin is now the smaller, both ways."""
    kwargs = {"task": "oscillator", "higher": False}
    base = [0.5 + 0.0001 * s for s in range(8)]
    rows = [cell("resnet", s, b, **kwargs) for s, b in enumerate(base)]
    rows += [cell("ddl", s, b + 0.053 + 0.0002 * (-1) ** s, **kwargs) for s, b in enumerate(base)]
    config = '[[comparisons]]\nmodel = "resnet"\ncontrol = "ddl"\n'
    rep = found(report(rows, config))
    forth, back = rep["ddl", "resnet", "test"], rep["resnet", "ddl", "test"]
    assert forth.paired.margin == back.paired.margin == pytest.approx(0.1 * np.mean(base))
    assert (forth.label, back.label) == ("loss", "win")


def parity_ood(requires):
    rows = [cell("resnet", s, 0.97, long=0.6) for s in range(8)]
    rows += [cell("ddl", s, 0.97, long=0.9 + 0.01 * (s % 2)) for s in range(8)]
    run = run_of(rows)
    return run, [
        Request("parity", "ddl", "resnet", kind, "long", r)
        for kind, r in zip(("declared", "expectation"), requires, strict=True)
    ]


@pytest.mark.parametrize("requires", [(0.5, 0.99), (0.99, 0.5)])
def test_merged_requests_keep_the_strictest_requires(requires):
    """Both rows reach test accuracy 0.97: judged on ``long`` at 0.5, not at 0.99, whichever
    asked first."""
    run, requests = parity_ood(requires)
    [c] = judge(run, requests).values()
    assert c.split == "test" and c.asked_split == "long"
    assert "ddl reached test accuracy ≥ 0.99 on 0 of 8 seeds" in c.note


def test_requires_reads_in_the_metrics_own_terms():
    rows = oscillator_rows(0.0)
    for r in rows:
        r.metrics["test"] = 0.5
    config = '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\nrequires = 0.01\n'
    c = next(c for c in report(rows, config).comparisons if c.asked_split == "long")
    assert "ddl reached test mse ≤ 0.01 on 0 of 8 seeds" in c.note


def test_requires_by_metric_reads_each_tasks_own_threshold():
    """One comparison over an MSE and an accuracy task: before, one number served both
    ("test mse ≤ 0.99")."""
    rows = oscillator_rows(0.0)
    for r in rows:
        r.metrics["test"] = 0.5
    rows += [cell(m, s, 0.97, long=0.6) for m in ("resnet", "ddl") for s in range(8)]
    config = (
        '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\n'
        "requires = { accuracy = 0.99, mse = 0.01 }\n"
    )
    notes = {c.task: c.note for c in report(rows, config).comparisons if c.asked_split == "long"}
    assert "ddl reached test mse ≤ 0.01 on 0 of 8 seeds" in notes["oscillator"]
    assert "ddl reached test accuracy ≥ 0.99 on 0 of 8 seeds" in notes["parity"]


# --- 7. non-finite metrics


def test_a_non_finite_metric_is_a_failure_with_a_note():
    """An ``ok`` cell with ∞ on ``long`` (a tied stack overflowing at 4× depth)."""
    rows = [cell("resnet", s, 0.99, long=0.9) for s in range(8)]
    rows += [cell("ddl", s, 0.99, long=math.inf if s == 5 else 0.95) for s in range(8)]
    config = '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\nrequires = 0.9\n'
    c = found(report(rows, config))["ddl", "resnet", "long"]
    assert c.paired.failed == (5,) and c.paired.n == 7
    assert "ddl: long not finite on seed(s) 5, counted as failures" in c.note


def test_holm_refuses_nan():
    with pytest.raises(ValueError, match="p-values"):
        holm([0.001, math.nan, 0.002])


# --- 8. the family, the text, the crossover's inputs


def test_a_mirrored_pair_is_one_test():
    rows = row("resnet", BASE8) + row(
        "ddl", [v + 0.02 + 0.01 * (s % 3) for s, v in enumerate(BASE8)]
    )
    config = '[[comparisons]]\nmodel = "resnet"\ncontrol = "ddl"\n'
    rep = report(rows, config)
    forth, back = found(rep)["ddl", "resnet", "test"], found(rep)["resnet", "ddl", "test"]
    assert rep.tests == 1
    assert forth.p_adjusted == back.p_adjusted == pytest.approx(forth.paired.p)


def test_a_test_that_cannot_reach_the_level_does_not_enlarge_the_family():
    """Three seeds with a failure (the smallest p is 0.25) beside a real test."""
    rows = row("resnet", BASE8) + row("ddl", BETTER8)
    rows += [cell("gated", 0, 0.9), cell("gated", 1, 0.9), cell("gated", 2, None, "failed")]
    rep = report(rows)
    ddl, gated = found(rep)["ddl", "resnet", "test"], found(rep)["gated", "resnet", "test"]
    assert gated.paired.total == 3 and gated.label == "fails"
    assert gated.p_adjusted is None and ddl.p_adjusted == pytest.approx(ddl.paired.p)
    assert rep.tests == 1


def test_the_report_shows_the_tost_with_its_90_percent_interval_and_raw_p():
    noise = [0.005 * (-1) ** s * (1 + s % 3) for s in range(8)]
    rows = row("resnet", BASE8) + row("same", [v + n for v, n in zip(BASE8, noise, strict=True)])
    rep = report(rows)
    [c] = rep.comparisons
    head, [cells] = comparison_cells(rep)
    text = cells[head.index("TOST p → Holm (margin; 90% interval)")]
    low, high = c.paired.interval
    assert c.label == "equivalent" and -0.01 < low < high < 0.01
    assert 0.001 < c.paired.tost < ALPHA  # shown to three decimals
    assert text.startswith(f"{c.paired.tost:.3f} → ") and "90% [" in text


def test_a_significant_difference_within_the_margin_leaves_a_claim_open():
    """Equivalence contradicts a claim only where no significant difference favours its
    side: a model better on every seed by less than the margin is not 'contradicted'."""
    assert claim_verdict("equivalent", "better", True) == "insufficient evidence"
    assert claim_verdict("equivalent", "better", None) == "contradicted"
    assert claim_verdict("equivalent", "worse", True) == "contradicted"
    rows = row("resnet", BASE8) + row("ddl", [v + 0.003 for v in BASE8])
    [c] = report(rows).comparisons
    assert c.label == "equivalent" and c.significant() is True
    assert "ddl significantly better, by less than the margin" in c.note


def test_seeds_only_one_row_has_are_noted():
    rows = row("resnet", BASE8[:5]) + row("ddl", BETTER8)
    [c] = report(rows).comparisons
    assert c.paired.only_model == (5, 6, 7)
    assert "seed(s) 5, 6, 7 only in ddl, not compared" in c.note


def test_the_detectable_difference_follows_the_deciding_test_and_its_n():
    noisy = [v + 0.3 * (-1) ** s for s, v in enumerate(BASE8)]
    [c] = report(row("resnet", BASE8) + row("gated", noisy)).comparisons
    assert c.label == "inconclusive"
    assert c.detectable == pytest.approx(detectable_difference(c.paired.sd, 8, ALPHA))
    # where a failure decides (the signed ranks), a difference in values says nothing
    failing = [*row("gated", noisy[:7]), cell("gated", 7, None, "failed")]
    [c] = report(row("resnet", BASE8) + failing).comparisons
    assert c.paired.failed == (7,) and c.detectable is None
    # six pairs: the t-test's, at six; four: the exact test decides, and a t-test's
    # detectable difference would not be its own
    [c] = report(row("resnet", BASE8[:6]) + row("gated", noisy[:6])).comparisons
    assert c.detectable == pytest.approx(detectable_difference(c.paired.sd, 6, ALPHA))
    [c] = report(row("resnet", BASE8[:4]) + row("gated", noisy[:4])).comparisons
    assert c.paired.test == SIGN_FLIP and c.detectable is None
    # three pairs and a failure: the signed ranks can never reach the level (2 / 2⁴), so
    # the test stays out of the family, states nothing detectable, and the text says why
    rep = report(
        [*row("resnet", BASE8[:4]), *row("gated", noisy[:3]), cell("gated", 3, None, "failed")]
    )
    [c] = rep.comparisons
    assert c.paired.floor == pytest.approx(0.125) and c.detectable is None
    assert rep.tests == 0 and "p cannot fall below 0.125" in render(rep)


def test_eight_seeds_can_carry_wins_and_equivalences_after_holm_over_forty_tests():
    """The t-test has no floor: at 8 seeds, 20 clear wins and 20 clear equivalences all
    survive Holm over their families (an exact permutation test's p cannot fall below
    2 / 2⁸ = 0.0078, nor its TOST below 2⁻⁸: none would)."""
    noise = [0.001 * (-1) ** s * (1 + s % 3) for s in range(8)]
    rows = row("resnet", BASE8)
    for name in range(20):
        rows += row(f"win{name}", BETTER8)
        rows += row(f"same{name}", [v + n for v, n in zip(BASE8, noise, strict=True)])
    rep = report(rows)
    assert rep.tests == 40
    labels = {c.model: c.label for c in rep.comparisons}
    assert {labels[f"win{i}"] for i in range(20)} == {"win"}
    assert {labels[f"same{i}"] for i in range(20)} == {"equivalent"}


def test_the_same_grid_in_another_order_is_equal_tuning():
    """Before: [1e-2, 1e-3] against [1e-3, 1e-2] read "unequal tuning"."""

    def tuned(model, values, grid):
        return [
            cell(model, s, v, train={"lr": lr}, tune={"lr": grid}, val=0.9 - lr)
            for lr in (1e-3, 1e-2)
            for s, v in enumerate(values)
        ]

    rows = tuned("resnet", BASE8, [1e-2, 1e-3]) + tuned("ddl", BETTER8, [1e-3, 1e-2])
    [c] = report(rows).comparisons
    assert c.label == "win"


def test_bf16_counts_only_where_both_rows_ran_on_cuda():
    """Before: a CPU row (bf16 ignored) against a CUDA row read "unequal budget" on bf16."""
    train = {"steps": 100, "bf16": True}
    rows = row("resnet", BASE8, train={**train, "device": "cpu"})
    rows += row("ddl", BETTER8, train={**train, "device": "cuda"})
    [c] = report(rows).comparisons
    assert c.label == "win"
    rows = row("resnet", BASE8, train={**train, "device": "cuda"})
    rows += row("ddl", BETTER8, train={**train, "bf16": False, "device": "cuda"})
    [c] = report(rows).comparisons
    assert c.label == "unequal budget" and "bf16" in c.note


def test_an_equivalence_carries_its_90_percent_interval_a_significance_flag_and_the_floor():
    """MSEs near 1e-5 against the default absolute margin 1e-4: the margin is 8× the means,
    and a model 35% worse on every seed, significantly, still reads equivalent: flagged."""
    kwargs = {"task": "oscillator", "higher": False}
    base = [1.2e-5 + 1e-7 * s for s in range(8)]
    rows = row("resnet", base, **kwargs)
    rows += row("ddl", [b * 1.35 + 2e-8 * (-1) ** s for s, b in enumerate(base)], **kwargs)
    [c] = report(rows).comparisons
    assert c.label == "equivalent" and c.also_different and c.significant() is False
    low, high = c.paired.interval
    assert 0 < low < c.paired.mean < high < c.paired.margin == 1e-4
    assert c.margin_ratio == pytest.approx(1e-4 / np.mean([v.metrics["test"] for v in rows[8:]]))
    # a margin that is the relative one records no ratio
    rows = oscillator_rows(0.0005)
    config = '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\nrequires = 0.01\n'
    assert found(report(rows, config))["ddl", "resnet", "long"].margin_ratio is None


def test_mirrored_requests_share_the_strictest_requires():
    """Before: a vs b at requires 0.5 and b vs a at 0.99 were judged on two splits."""
    run, _ = parity_ood((0.5, 0.5))
    requests = [
        Request("parity", "ddl", "resnet", "declared", "long", 0.5),
        Request("parity", "resnet", "ddl", "declared", "long", 0.99),
    ]
    judged = judge(run, requests)
    assert {c.split for c in judged.values()} == {"test"}
