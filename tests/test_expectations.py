"""Expectations as comparisons: which cells a claim names, and when evidence suffices."""

import pytest

import ddl_dynamics as dd
from ddl_dynamics.analysis.judge.comparisons import judge as judge_all
from ddl_dynamics.analysis.judge.expectations import judge_expectations, match, request_for
from ddl_dynamics.analysis.judge.verdicts import CONFIRMED, CONTRADICTED, INSUFFICIENT
from ddl_dynamics.analysis.run import run_of
from ddl_dynamics.models.base import list_models, model_options

DEFAULTS = {
    family: {k: d for k, (d, _) in model_options(family).items()} for family in list_models()
}


def cell(label, seed, test, family=None, status="ok", long=None, steps=100, **options):
    """A hand-made cell of family ``family`` (default: the label) with resolved options,
    trained ``steps`` steps."""
    family = family or label
    config = {**DEFAULTS[family], "width": 32, "hidden": 40, **options}
    return dd.RunResult(
        status=status,
        key=f"{label}-{seed}",
        task="t",
        model=label,
        seed=seed,
        params=1000,
        metrics={"test": test, "ood": {"long": long}},
        config={
            "model": family,
            "config": config,
            "train": {"steps": steps, "batch_size": 128, "n_train": 2048},
        },
    )


def judge(task, expectation, rows, higher_is_better):
    """One claim judged alone, as the report judges it among its comparisons."""
    for r in rows:
        r.task, r.metrics["higher_is_better"] = task, higher_is_better
    run = run_of(rows)
    request = request_for(task, expectation, [row.cells[0] for row in run.rows.values()])
    judged = judge_all(run, [] if isinstance(request, str) else [request])
    return judge_expectations([(task, expectation, request)], judged, {task: higher_is_better})[0]


def cells(label, values, **kwargs):
    return [cell(label, seed, v, **kwargs) for seed, v in enumerate(values)]


#: Six seeds: where a seed fails, the signed ranks that decide reach p < 0.05 (2 / 2⁶).
WIN = [0.10, 0.12, 0.11, 0.13, 0.10, 0.12]  # an MSE well below LOSE on every seed
LOSE = [0.50, 0.55, 0.52, 0.51, 0.56, 0.53]


def claim(model="ddl", relation="better", control="resnet", **kwargs):
    return dd.Expectation(model, relation, control, "a reason", **kwargs)


def test_a_paired_significant_difference_confirms_or_contradicts():
    rows = cells("ddl", WIN) + cells("resnet", LOSE)
    v = judge("t", claim(), rows, higher_is_better=False)
    assert v.verdict == CONFIRMED and (v.model, v.control) == ("ddl", "resnet")
    paired = v.comparison.paired
    assert paired.n == 6 and paired.p < 0.05 and v.comparison.p_adjusted == paired.p
    assert paired.mean == pytest.approx((sum(WIN) - sum(LOSE)) / 6)
    assert judge("t", claim(relation="worse"), rows, False).verdict == CONTRADICTED
    # The direction is the metric's: on an accuracy the same numbers read the other way.
    assert judge("t", claim(), rows, higher_is_better=True).verdict == CONTRADICTED


def test_fewer_than_three_seeds_is_insufficient_evidence():
    rows = cells("ddl", WIN[:2]) + cells("resnet", LOSE)
    v = judge("t", claim(), rows, False)
    assert v.verdict == INSUFFICIENT and "inconclusive, n = 2" in v.note
    # One seed of a bound claim confirms nothing either.
    v = judge("t", claim(control=1.0), cells("ddl", WIN[:1]), False)
    assert v.verdict == INSUFFICIENT and v.comparison.paired.n == 1


def test_failed_seeds_count_against_their_model_and_the_verdict_says_so():
    rows = cells("ddl", WIN) + cells("resnet", LOSE)
    for r, status in zip(rows[1:5], ("diverged", "capped", "failed", "diverged"), strict=True):
        r.status = status
    v = judge("t", claim(), rows, False)
    paired = v.comparison.paired
    assert v.verdict == INSUFFICIENT and (paired.n, paired.total) == (2, 6)
    assert v.comparison.label == "fails"
    assert paired.failed == (1, 2, 3, 4) and paired.better(False) is False
    assert "ddl fails 4/6 (seeds 1, 2, 3, 4 rank last)" in v.note


def test_no_significant_difference_is_insufficient_evidence():
    rows = cells("ddl", [0.1, 0.9, 0.5, 0.2, 0.8, 0.6]) + cells("resnet", LOSE)
    v = judge("t", claim(), rows, False)
    assert v.verdict == INSUFFICIENT and v.note == "inconclusive, n = 6"


def test_a_control_trained_on_another_budget_is_insufficient_evidence():
    rows = cells("ddl", WIN, steps=150) + cells("resnet", LOSE, steps=50)
    v = judge("t", claim(), rows, False)
    assert v.verdict == INSUFFICIENT and v.comparison.paired is None
    assert v.comparison.label == "unequal budget" and v.note == "ddl steps=150; resnet steps=50"
    # An analytic bound has no budget: the same model is judged against it.
    assert judge("t", claim(control=1.0), rows, False).verdict == CONFIRMED


def test_a_missing_control_is_insufficient_evidence():
    v = judge("t", claim(control="ddl-write"), cells("ddl", WIN), False)
    assert v.verdict == INSUFFICIENT and "no cell of the control ddl-write" in v.note


def test_an_analytic_bound_uses_the_one_sample_test():
    floor = [1.07, 1.09, 1.08, 1.07, 1.09, 1.08]
    v = judge("t", claim("node", "worse", 0.975), cells("node", floor), False)
    assert v.verdict == CONFIRMED and v.control is None
    assert v.comparison.paired.mean == pytest.approx(1.08 - 0.975)
    solved = judge("t", claim("node", "worse", 0.975), cells("node", WIN), False)
    assert solved.verdict == CONTRADICTED


LINEAR = {"tied": True, "context": "control"}


def parity_rows(test_b2, long_b2, long_b1, test_b1=(1.0,) * 6):
    rows = [
        cell("lin", s, t, family="ddl", long=x, beta_max=2.0, **LINEAR)
        for s, (t, x) in enumerate(zip(test_b2, long_b2, strict=True))
    ]
    rows += [
        cell("lin-bmax1", s, t, family="ddl", long=x, beta_max=1.0, **LINEAR)
        for s, (t, x) in enumerate(zip(test_b1, long_b1, strict=True))
    ]
    return rows + cells("ddl", [1.0] * 6, family="ddl")  # the state-dependent stack


def parity_claim():
    return dd.Expectation(
        dd.Subject("ddl", {**LINEAR, "beta_max": 2.0}),
        "better",
        dd.Subject("ddl", {**LINEAR, "beta_max": 1.0}),
        "Grazzi et al.",
        split="long",
        requires=0.95,
    )


def test_ood_claim_needs_both_rows_to_succeed_in_distribution():
    long_b2, long_b1 = [0.99, 1.0, 0.98, 0.99, 1.0, 0.97], [0.52, 0.50, 0.51, 0.5, 0.53, 0.5]
    fitted = [1.0, 1.0, 0.99, 1.0, 0.98, 1.0]
    solved = judge(
        "parity", parity_claim(), parity_rows(fitted, long_b2, long_b1), higher_is_better=True
    )
    assert solved.verdict == CONFIRMED and (solved.model, solved.control) == ("lin", "lin-bmax1")
    assert solved.comparison.split == "long"
    # One seed that did not learn the trained length: the extrapolation means nothing.
    v = judge(
        "parity", parity_claim(), parity_rows([1.0, 0.55, *fitted[2:]], long_b2, long_b1), True
    )
    assert v.verdict == INSUFFICIENT and v.comparison.split == "test"
    assert "long not judged: lin reached test metric ≥ 0.95 on 5 of 6 seeds" in v.note
    # Nor when the control never fitted the trained length: that is a failure to fit.
    v = judge(
        "parity",
        parity_claim(),
        parity_rows(fitted, long_b2, long_b1, test_b1=[0.47, 0.44, 0.45] * 2),
        True,
    )
    assert v.verdict == INSUFFICIENT
    assert "lin-bmax1 reached test metric ≥ 0.95 on 0 of 6 seeds" in v.note


def test_ood_claims_must_state_their_precondition():
    with pytest.raises(ValueError, match="must state `requires`"):
        claim(split="long")
    with pytest.raises(ValueError, match="relation"):
        claim(relation="<")


def test_a_family_name_means_its_plain_entry_sizes_aside():
    rows = (
        cells("ddl", WIN)
        + cells("ddl-bmax1", WIN, family="ddl", beta_max=1.0)
        + cells("ddl-tied", WIN, family="ddl", tied=True, hidden=90)
        + cells("ddl-write", WIN)
    )
    assert match(dd.Subject("ddl"), rows) == ["ddl"]
    assert match(dd.Subject("ddl", {"beta_max": 1.0}), rows) == ["ddl-bmax1"]
    assert match(dd.Subject("ddl", {"tied": True}), rows) == ["ddl-tied"]
    assert match(dd.Subject("ddl-write"), rows) == ["ddl-write"]
    assert match(dd.Subject("ddl", {"context": "control"}), rows) == []  # not run
    assert match(dd.Subject("no-such-family"), rows) == []
    # Two entries that differ only in an option the claim leaves free: ambiguous.
    twins = cells("a", WIN, family="ddl", beta_init=0.1) + cells(
        "b", WIN, family="ddl", beta_init=0.9
    )
    assert match(dd.Subject("ddl"), twins) == []
    v = judge(
        "t",
        claim(control="ddl-write"),
        cells("ddl", WIN, tied=True)
        + cells("ddl-2", WIN, family="ddl", tied=True)
        + cells("ddl-write", LOSE),
        False,
    )
    assert v.verdict == INSUFFICIENT and "several entries match the model ddl: ddl, ddl-2" in v.note


def test_rows_at_the_floor_up_to_their_test_splits_sampling_spread_leave_a_claim_open():
    """transformer-depth-long, var-chain hops 3 on 512 test queries: seeds at the 0.625
    shortcut score 0.58-0.65 (its binomial spread is ±0.021), more than the 0.01 margin, and
    read "equivalent", so the claim read contradicted. A seed within 3 binomial standard
    deviations of the floor sits at it."""
    from ddl_dynamics._task import make_task

    ddl = [0.6006, 0.6016, 0.6035, 0.6123, 0.6201, 0.624, 0.626, 0.6396]
    base = [0.5967, 0.6045, 0.6064, 0.6094, 0.626, 0.6279, 0.6289, 0.6387]
    rows = cells("ddl-transformer", ddl) + cells("transformer", base)
    for r in rows:
        r.config.update(task="var-chain", spec={"hops": 3})
        r.config["train"]["n_test"] = 512
    task = make_task("var-chain", hops=3)
    claim_ = next(e for e in task.expectations if e.control.family == "transformer")
    v = judge("var-chain[hops=3]", claim_, rows, higher_is_better=True)
    assert v.comparison.label == "both at floor" and v.verdict == INSUFFICIENT
    # on 20,000 queries the spread is ±0.0034: 0.64 is above the band (0.6353)
    for r in rows:
        r.config["train"]["n_test"] = 20_000
    v = judge("var-chain[hops=3]", claim_, rows, higher_is_better=True)
    assert v.comparison.label != "both at floor"


def test_a_wider_compute_matched_baseline_beside_the_plain_one_leaves_the_claim_its_control():
    """charlm: `transformer` and `transformer-w40` (the same family, wider to match the Delta
    rows' FLOPs) both matched "transformer", and the claim read insufficient evidence. The
    control of the model's size is the one the claim names."""
    rows = (
        cells("ddl", WIN)
        + cells("resnet", LOSE)
        + cells("resnet-w40", LOSE, family="resnet", width=40)
    )
    for r in rows:
        r.params = 1500 if r.model == "resnet-w40" else 1000
    v = judge("t", claim(), rows, False)
    assert (v.control, v.verdict) == ("resnet", CONFIRMED)
    for r in rows:  # no entry of the model's size: still ambiguous, said so
        r.params = 1250 if r.model == "ddl" else r.params
    v = judge("t", claim(), rows, False)
    assert v.verdict == INSUFFICIENT
    assert "several entries match the control resnet: resnet, resnet-w40" in v.note


def test_two_rows_at_the_floor_leave_a_claim_open():
    """var-chain at hops 3: answering with a random chain's start value scores 0.625, and
    both rows sit there. Before: 0.6177 against 0.6173 read "equivalent", and the claim
    "ddl-transformer better than transformer" read contradicted."""
    from ddl_dynamics._task import make_task

    ddl = [0.6177 + 0.002 * (-1) ** s for s in range(8)]
    base = [0.6173 + 0.0015 * (-1) ** (s // 2) for s in range(8)]
    rows = cells("ddl-transformer", ddl) + cells("transformer", base)
    for r in rows:
        r.config.update(task="var-chain", spec={"hops": 3})
    task = make_task("var-chain", hops=3)
    claim_ = next(e for e in task.expectations if e.control.family == "transformer")
    v = judge("var-chain[hops=3]", claim_, rows, higher_is_better=True)
    assert v.comparison.label == "both at floor" and v.verdict == INSUFFICIENT
    assert v.comparison.p_adjusted is None and v.comparison.tost_adjusted is None
    # a row above the floor by more than the margin gets its test
    above = cells("ddl-transformer", [d + 0.05 for d in ddl])
    for r in above:
        r.config.update(task="var-chain", spec={"hops": 3})
    v = judge("var-chain[hops=3]", claim_, above + rows[8:], higher_is_better=True)
    assert v.comparison.label == "win" and v.verdict == CONFIRMED
