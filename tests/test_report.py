"""The report: verdicts first, paired against each model's baseline; tables that show n,
every seed, and never average a failed cell."""

import csv
import io
import json

import pytest
from scipy import stats

import ddl_dynamics as dd
from ddl_dynamics.analysis.report import render
from ddl_dynamics.analysis.stats import mean_ci


def row(model, seed, test, status="ok", task="parity", message="", long=None, params=100,
        higher=True, **config):
    return dd.RunResult(
        status=status, message=message, key=f"{task}-{model}-{seed}", task=task, model=model,
        seed=seed, params=params, flops=2e3, wall_time=1.0, config=config,
        metrics={"metric": "accuracy" if higher else "mse", "higher_is_better": higher,
                 "test": test, "val": test, "train": test, "ood": {"long": long},
                 "skipped": {} if long is not None else
                 {"long": "an untied model cannot run 32 steps"}, "extra": {"drift": 0.1}},
    )


RESNET = [0.50, 0.55, 0.52]
DDL = [0.90, 0.95, 0.93]


@pytest.fixture
def run_dir(tmp_path):
    store = dd.ResultStore(tmp_path / "results.sqlite")
    store.start_run("demo", 'name = "demo"')
    for seed, (a, b) in enumerate(zip(RESNET, DDL, strict=True)):
        store.put(row("resnet", seed, a))
        store.put(row("ddl", seed, b, long=b - 0.1, params=110))
    store.put(row("ddl", 3, float("nan"), status="diverged", message="loss became nan at step 7",
                  params=110))
    store.put(row("ddl", 4, 0.99, status="capped", message="time cap of 5 s", params=110))
    store.put(row("node", 0, 0.6))
    store.put(row("node", 1, None, status="failed", message="RuntimeError: boom"))
    return tmp_path


def test_failed_seeds_are_counted_never_averaged(run_dir):
    report = dd.build_report(run_dir)
    assert report.name == "demo" and len(report.tables) == 1
    table = report.tables[0]
    assert table.higher_is_better and table.ood_splits == ["long"] and table.has_val
    rows = {r.model: r for r in table.rows}
    assert table.rows[0].model == "resnet"  # the baseline leads
    ddl = rows["ddl"]
    assert ddl.statuses == {"ok": 3, "diverged": 1, "capped": 1}
    assert (ddl.finished, ddl.run) == (3, 5)
    # The capped seed (0.99) and the diverged one are failures: not in the mean.
    assert ddl.test.n == 3 and ddl.test.mean == pytest.approx(sum(DDL) / 3)
    assert ddl.test.ci == pytest.approx(mean_ci(DDL)[1])
    assert ddl.per_seed == {0: 0.90, 1: 0.95, 2: 0.93, 3: "diverged", 4: "capped"}
    assert ddl.ood["long"].n == 3 and rows["resnet"].ood["long"].mean is None
    assert ddl.params == 110 and ddl.params_ratio == pytest.approx(1.1)
    assert rows["resnet"].params_ratio is None and rows["resnet"].baseline is None
    assert rows["node"].test.n == 1 and rows["node"].test.ci is None
    problems = {(p.model, p.status) for p in table.problems}
    assert {("ddl", "diverged"), ("ddl", "capped"), ("node", "failed")} <= problems
    assert any("resnet" in p.model and p.status == "long not run" for p in table.problems)


def test_comparisons_are_paired_against_the_baseline(run_dir):
    report = dd.build_report(run_dir)
    versus = {c.model: c for c in report.comparisons}
    assert set(versus) == {"ddl", "node"}  # the baseline is not compared with itself
    ddl = versus["ddl"]
    assert ddl.baseline == "resnet" and (ddl.finished, ddl.run) == (3, 5)
    assert ddl.paired.seeds == (0, 1, 2)
    assert ddl.paired.p == pytest.approx(stats.ttest_rel(DDL, RESNET).pvalue)
    assert ddl.paired.mean == pytest.approx((sum(DDL) - sum(RESNET)) / 3)
    assert ddl.mark == "win"  # accuracy: higher is better
    assert versus["node"].paired.n == 1 and versus["node"].mark == "n < 3"


def store_rows(tmp_path, rows):
    store = dd.ResultStore(tmp_path / "results.sqlite")
    for r in rows:
        store.put(r)
    return tmp_path


def test_win_and_loss_follow_the_metric_direction(tmp_path):
    # MSE: lower is better, so the model with the larger values loses.
    rows = [row("resnet", s, v, higher=False) for s, v in enumerate(RESNET)]
    rows += [row("ddl", s, v, higher=False) for s, v in enumerate(DDL)]
    rows += [row("gated", s, v + 0.3 * (-1) ** s, higher=False) for s, v in enumerate(RESNET)]
    marks = {c.model: c.mark for c in dd.build_report(store_rows(tmp_path, rows)).comparisons}
    assert marks == {"ddl": "loss", "gated": "tie"}


def test_rows_trained_on_unequal_budgets_get_no_verdict(tmp_path):
    rows = [row("resnet", s, v, train={"steps": 150}) for s, v in enumerate(RESNET)]
    rows += [row("ddl", s, v, train={"steps": 150}) for s, v in enumerate(DDL)]
    rows += [row("node", s, v, train={"steps": 50}) for s, v in enumerate(DDL)]
    report = dd.build_report(store_rows(tmp_path, rows))
    marks = {c.model: c.mark for c in report.comparisons}
    assert marks == {"ddl": "win", "node": "unequal budget"}
    assert any(line.startswith("| parity (accuracy ↑) | node | resnet | 3/3 |")
               and line.endswith("| unequal budget |") for line in render(report).splitlines())


def test_stored_baselines_override_the_default(tmp_path):
    rows = [row("resnet", s, 0.5, baseline=None) for s in range(3)]
    rows += [row("resnet-tied", s, v, baseline=None, params=50) for s, v in enumerate(RESNET)]
    rows += [row("ddl-tied", s, v, baseline="resnet-tied", params=55)
             for s, v in enumerate(DDL)]
    rows += [row("node", s, 0.6) for s in range(3)]  # stored without the key: resnet
    report = dd.build_report(store_rows(tmp_path, rows))
    assert {(c.model, c.baseline) for c in report.comparisons} == {
        ("ddl-tied", "resnet-tied"), ("node", "resnet")}
    rows = {r.model: r for r in report.tables[0].rows}
    assert rows["ddl-tied"].params_ratio == pytest.approx(1.1)
    assert [r.model for r in report.tables[0].rows][:2] == ["resnet", "resnet-tied"]


def test_reconstruction_flag_marks_the_row(tmp_path):
    rows = [row("resnet", s, 0.5) for s in range(2)]
    for s in range(2):
        r = row("node", s, 0.6)
        r.metrics |= {"reconstruction_error": 0.2, "reconstruction_tolerance": 0.01,
                      "reconstruction_flag": s == 1}
        rows.append(r)
    report = dd.build_report(store_rows(tmp_path, rows))
    node = next(r for r in report.tables[0].rows if r.model == "node")
    assert node.flagged == (1,)
    md = render(report, "md")
    assert "| node ⚑ |" in md and "⚑ node: on seed(s) 1 the ODE reconstruction error" in md


def test_markdown_opens_with_the_verdicts(run_dir):
    md = render(dd.build_report(run_dir), "md")
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Verdicts against each model's baseline"
    assert sections.index("## Results per task") > 0
    assert "| parity (accuracy ↑) | ddl | resnet | 3/5 (60%) | +0.403 ± " in md
    assert "| win |" in md and "| n < 3 |" in md
    assert "### parity — accuracy ↑" in md
    assert "| ddl | 3/5 (60%) | 0.9267 ± " in md and "| 0.9, 0.95, 0.93, diverged, capped |" in md
    assert "| 0.6 |" in md  # n = 1: a bare mean, no interval
    assert "**diverged** — loss became nan at step 7" in md and "**failed**" in md
    assert "3 ok, 1 capped, 1 diverged" in md and "(1.10×)" in md


def test_csv_and_json_lead_with_the_verdicts(run_dir):
    report = dd.build_report(run_dir)
    text = render(report, "csv")
    head = text.splitlines()[0].split(",")
    assert head[:7] == ["task", "model", "metric", "higher_is_better", "baseline", "verdict",
                        "diff_mean"]
    rows = {r["model"]: r for r in csv.DictReader(io.StringIO(text))}
    assert set(rows) == {"resnet", "ddl", "node"}
    assert rows["ddl"]["verdict"] == "win" and rows["resnet"]["verdict"] == ""
    assert float(rows["ddl"]["p_paired_t"]) == pytest.approx(stats.ttest_rel(DDL, RESNET).pvalue)
    assert rows["ddl"]["finished"] == "3" and rows["ddl"]["run"] == "5"
    assert rows["ddl"]["test_per_seed"] == "0: 0.9; 1: 0.95; 2: 0.93; 3: diverged; 4: capped"

    def reject(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(render(report, "json"), parse_constant=reject)
    sections = [k for k in data if k in ("comparisons", "expectations", "tables")]
    assert sections == ["comparisons", "expectations", "tables"]
    assert data["comparisons"][0]["model"] == "ddl" and data["comparisons"][0]["mark"] == "win"
    assert data["tables"][0]["rows"][0]["model"] == "resnet"
    with pytest.raises(ValueError, match="unknown report format"):
        render(report, "pdf")


def test_missing_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results store"):
        dd.build_report(tmp_path / "nowhere")
