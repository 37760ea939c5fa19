"""The report: statistics against scipy, and tables that never hide a failed cell."""

import csv
import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

import ddl_dynamics as dd
from ddl_dynamics.analysis.report import mean_ci, render, welch_p

samples = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=8).filter(
    lambda xs: max(xs) - min(xs) > 1e-3)


@given(samples)
def test_mean_ci_matches_scipy_t_interval(xs):
    mean, half = mean_ci(xs)
    low, high = stats.t.interval(0.95, len(xs) - 1, loc=mean, scale=stats.sem(xs))
    assert mean == pytest.approx(sum(xs) / len(xs))
    assert half == pytest.approx((high - low) / 2, rel=1e-9, abs=1e-9)


@given(samples, samples)
def test_welch_p_matches_scipy(a, b):
    expected = stats.ttest_ind(a, b, equal_var=False).pvalue
    assert welch_p(a, b) == pytest.approx(expected, rel=1e-7, abs=1e-12)


def test_degenerate_samples_have_no_interval_or_p_value():
    assert mean_ci([2.5]) == (2.5, None)
    assert welch_p([1.0], [1.0, 2.0]) is None
    assert welch_p([1.0, 1.0], [1.0, 1.0]) is None


def row(model, seed, test, status="ok", task="parity", message="", long=None):
    return dd.RunResult(
        status=status, message=message, key=f"{task}-{model}-{seed}", task=task, model=model,
        seed=seed, params=100, flops=2e3, wall_time=1.0,
        metrics={"metric": "accuracy", "higher_is_better": True, "test": test, "train": test,
                 "ood": {"long": long}, "skipped": {} if long is not None else
                 {"long": "an untied model cannot run 32 steps"}, "extra": {"drift": 0.1}},
    )


@pytest.fixture
def run_dir(tmp_path):
    store = dd.ResultStore(tmp_path / "results.sqlite")
    store.start_run("demo", 'name = "demo"')
    resnet = [0.50, 0.55, 0.52]
    ddl = [0.90, 0.95, 0.93]
    for seed, (a, b) in enumerate(zip(resnet, ddl, strict=True)):
        store.put(row("resnet", seed, a))
        store.put(row("ddl", seed, b, long=b - 0.1))
    store.put(row("ddl", 3, float("nan"), status="diverged", message="loss became nan at step 7"))
    store.put(row("node", 0, 0.6))
    store.put(row("node", 1, None, status="failed", message="RuntimeError: boom"))
    return tmp_path


def test_report_tables_aggregate_seeds_and_count_every_status(run_dir):
    report = dd.build_report(run_dir)
    assert report.name == "demo" and len(report.tables) == 1
    table = report.tables[0]
    assert table.higher_is_better and table.ood_splits == ["long"]
    rows = {r.model: r for r in table.rows}
    assert table.rows[0].model == "resnet"  # the baseline leads
    ddl = rows["ddl"]
    assert ddl.statuses == {"ok": 3, "diverged": 1}
    assert ddl.test.n == 3 and ddl.test.mean == pytest.approx(0.9266666, rel=1e-5)
    assert ddl.test.ci == pytest.approx(mean_ci([0.90, 0.95, 0.93])[1])
    assert ddl.p_value == pytest.approx(
        stats.ttest_ind([0.90, 0.95, 0.93], [0.50, 0.55, 0.52], equal_var=False).pvalue)
    assert ddl.ood["long"].n == 3 and rows["resnet"].ood["long"].mean is None
    assert rows["node"].test.n == 1 and rows["node"].test.ci is None
    assert rows["node"].p_value is None  # one seed: no test
    problems = {(p.model, p.status) for p in table.problems}
    assert {("ddl", "diverged"), ("node", "failed")} <= problems
    assert any("resnet" in p.model and p.status == "long not run" for p in table.problems)


def test_renderers(run_dir):
    report = dd.build_report(run_dir)
    md = render(report, "md")
    assert "## parity — accuracy ↑" in md and "p vs resnet" in md
    assert "0.9267 ± " in md and "| 0.6 |" in md  # n = 1: a bare mean, no interval
    assert "**diverged** — loss became nan at step 7" in md and "**failed**" in md
    assert "3 ok, 1 diverged" in md
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert {r["model"] for r in rows} == {"resnet", "ddl", "node"}
    assert float(next(r for r in rows if r["model"] == "ddl")["test_mean"]) == pytest.approx(
        report.tables[0].rows[1].test.mean)
    def reject(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(render(report, "json"), parse_constant=reject)
    assert data["tables"][0]["rows"][0]["model"] == "resnet"
    with pytest.raises(ValueError, match="unknown report format"):
        render(report, "pdf")


def test_missing_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results store"):
        dd.build_report(tmp_path / "nowhere")
