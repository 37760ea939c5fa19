"""The report: verdicts first, paired against each model's baseline; tables that show n,
every seed, and never average a failed cell."""

import csv
import io
import json

import pytest
from scipy import stats

import ddl_dynamics as dd
from ddl_dynamics.analysis.judge.stats import holm, mean_ci
from ddl_dynamics.analysis.render.formats import render
from ddl_dynamics.analysis.report.wording import metric_title


def row(
    model,
    seed,
    test,
    status="ok",
    task="parity",
    message="",
    long=None,
    params=100,
    higher=True,
    key_suffix="",
    **config,
):
    return dd.RunResult(
        status=status,
        message=message,
        key=f"{task}-{model}-{seed}{key_suffix}",
        task=task,
        model=model,
        seed=seed,
        params=params,
        flops=2e3,
        wall_time=1.0,
        config=config,
        metrics={
            "metric": "accuracy" if higher else "mse",
            "higher_is_better": higher,
            "test": test,
            "val": test,
            "train": test,
            "ood": {"long": long},
            "skipped": {} if long is not None else {"long": "an untied model cannot run 32 steps"},
            "extra": {"drift": 0.1},
        },
    )


RESNET = [0.50, 0.55, 0.52]
DDL = [0.90, 0.95, 0.93]


@pytest.fixture
def run_dir(tmp_path):
    store = dd.RunFolder.open(tmp_path, "w").store
    store.start_run("demo", 'name = "demo"')
    for seed, (a, b) in enumerate(zip(RESNET, DDL, strict=True)):
        store.put(row("resnet", seed, a))
        store.put(row("ddl", seed, b, long=b - 0.1, params=110))
    store.put(
        row(
            "ddl",
            3,
            float("nan"),
            status="diverged",
            message="loss became nan at step 7",
            params=110,
        )
    )
    store.put(row("ddl", 4, 0.99, status="capped", message="time cap of 5 s", params=110))
    for seed in (3, 4):  # the seeds ddl did not finish, which resnet did
        store.put(row("resnet", seed, 0.5))
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


def test_comparisons_are_paired_against_the_baseline_and_failures_count(run_dir):
    report = dd.build_report(run_dir)
    versus = {c.model: c for c in report.comparisons}
    assert set(versus) == {"ddl", "node"}  # the baseline is not compared with itself
    ddl = versus["ddl"]
    assert ddl.control == "resnet" and ddl.kinds == ("baseline",)
    assert ddl.paired.seeds == (0, 1, 2) and ddl.paired.failed == (3, 4)
    assert ddl.paired.mean == pytest.approx((sum(DDL) - sum(RESNET)) / 3)
    # better on the 3 seeds it finished (paired t p = 0.0004), but 2 of 5 seeds diverged
    # or were capped: they rank as its worst outcomes, so it does not win
    assert stats.ttest_rel(DDL, RESNET).pvalue < 0.001
    assert ddl.paired.test == "signed rank, failures last" and ddl.label == "inconclusive"
    assert "ddl fails 2/5" in ddl.note
    # node finished one seed of two: fewer than 3 pairs, with a failure: "fails k/n"
    assert versus["node"].paired.total == 2 and versus["node"].label == "fails"


def store_rows(tmp_path, rows, config=""):
    store = dd.RunFolder.open(tmp_path, "w").store
    if config:
        store.start_run("demo", config)
    for r in rows:
        store.put(r)
    return tmp_path


def seeds(model, values, **kwargs):
    return [row(model, s, v, **kwargs) for s, v in enumerate(values)]


#: Eight seeds of an accuracy, and a model better on every one of them.
BASE8 = [0.50, 0.55, 0.52, 0.48, 0.51, 0.53, 0.49, 0.56]
BETTER8 = [v + 0.3 + 0.01 * (-1) ** s for s, v in enumerate(BASE8)]


def labels(report):
    return {(c.model, c.control_text): c.label for c in report.comparisons}


def test_win_loss_and_inconclusive_follow_the_metric_direction(tmp_path):
    # MSE: lower is better, so the model with the larger values loses.
    rows = seeds("resnet", BASE8, higher=False) + seeds("ddl", BETTER8, higher=False)
    rows += seeds("gated", [v + 0.3 * (-1) ** s for s, v in enumerate(BASE8)], higher=False)
    report = dd.build_report(store_rows(tmp_path, rows))
    assert labels(report) == {("ddl", "resnet"): "loss", ("gated", "resnet"): "inconclusive"}
    gated = next(c for c in report.comparisons if c.model == "gated")
    assert gated.detectable > 0.2  # what 8 seeds this noisy could have shown
    assert "inconclusive (n = 8; detectable ±" in render(report)


def test_a_shared_ceiling_reads_both_solved_outside_the_family(tmp_path):
    """Both rows at 1.0 on 3 seeds: a ceiling, neither a difference nor an equivalence."""
    rows = seeds("resnet", [1.0] * 3) + seeds("ddl", [1.0] * 3)
    report = dd.build_report(store_rows(tmp_path, rows))
    assert labels(report) == {("ddl", "resnet"): "both solved"}
    assert "| both solved (n = 3) |" in render(report) and report.tests == 0


def test_p_values_are_holm_adjusted_over_every_test_of_the_report(tmp_path):
    rows = seeds("resnet", BASE8)
    shifts = {"a": 0.3, "b": 0.02, "c": 0.015}  # one clear win, two small effects
    for name, shift in shifts.items():
        rows += seeds(
            name, [v + shift + 0.01 * (-1) ** s * (s % 3) for s, v in enumerate(BASE8)], params=100
        )
    report = dd.build_report(store_rows(tmp_path, rows))
    raw = [c.paired.p for c in report.comparisons]
    assert [c.p_adjusted for c in report.comparisons] == pytest.approx(holm(raw))
    assert report.tests == 3 and "This report draws 3 tests." in render(report)
    smallest = min(raw)
    assert min(c.p_adjusted for c in report.comparisons) == pytest.approx(3 * smallest)


def test_equivalent_only_inside_the_tasks_margin(tmp_path):
    # parity (accuracy) states no margin of its own: one point of accuracy
    noise = [0.002 * (-1) ** s * (1 + s % 3) for s in range(8)]
    rows = seeds("resnet", BASE8)
    rows += seeds("same", [v + n for v, n in zip(BASE8, noise, strict=True)])
    rows += seeds("near", [v + 0.02 + n for v, n in zip(BASE8, noise, strict=True)])
    for r in rows:
        r.config.update(task="parity", spec={})
    report = dd.build_report(store_rows(tmp_path, rows))
    found = {c.model: c for c in report.comparisons}
    assert found["same"].paired.margin == pytest.approx(0.01)
    assert found["same"].label == "equivalent" and found["same"].tost_adjusted < 0.05
    # 0.02 apart on every seed: a real difference, outside the margin, so a win
    assert found["near"].label == "win" and found["near"].tost_adjusted > 0.05


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"lr": 0.03}, "lr=0.003/0.03"),
        ({"warmup": 0.5}, "warmup=0.05/0.5"),
        ({"n_test": 128}, "n_test=128/512"),
        ({"grad_clip": 0.0}, "grad_clip=0.0/1.0"),
    ],
)
def test_any_difference_in_the_training_config_is_an_unequal_budget(tmp_path, change, why):
    train = {
        "steps": 100,
        "lr": 0.003,
        "warmup": 0.05,
        "n_test": 512,
        "grad_clip": 1.0,
        "seed": None,
    }
    rows = seeds("resnet", BASE8, train=train)
    rows += seeds("ddl", BETTER8, train={**train, **change})
    report = dd.build_report(store_rows(tmp_path, rows))
    [c] = report.comparisons
    assert c.label == "unequal budget" and c.paired is None and why.split("/")[0] in c.note
    assert any(
        line.startswith("| parity (accuracy ↑) | ddl | resnet |") and "| unequal budget |" in line
        for line in render(report).splitlines()
    )


def test_an_early_stop_and_a_size_mismatch_get_no_verdict(tmp_path):
    rows = seeds("resnet", BASE8, train={"steps": 150})
    rows += seeds("ddl", BETTER8, train={"steps": 150})
    for r, steps in zip(rows[8:], (100, 150, 50, 150, 150, 150, 150, 150), strict=True):
        r.metrics["steps"] = steps
    rows += seeds("big", BETTER8, train={"steps": 150}, params=120)
    report = dd.build_report(store_rows(tmp_path, rows))
    found = {c.model: c for c in report.comparisons}
    assert found["ddl"].label == "unequal budget"
    assert "ddl stopped early on 2 seed(s) at 100, 50 steps" in found["ddl"].note
    assert found["big"].label == "unmatched size"
    assert "big has 120 parameters, resnet 100: more than 10% apart" in found["big"].note


def tuned(model, values_by_lr, val_by_lr, **kwargs):
    """A row tuned over lr: ``values_by_lr[lr]`` test and ``val_by_lr[lr]`` val per seed."""
    out = []
    for lr, values in values_by_lr.items():
        for s, v in enumerate(values):
            r = row(
                model,
                s,
                v,
                key_suffix=f"lr{lr}",
                tune={"lr": sorted(values_by_lr)},
                train={"lr": lr},
                **kwargs,
            )
            r.metrics["val"] = val_by_lr[lr]
            out.append(r)
    return out


def test_a_tuned_row_is_reported_at_its_best_val_value_and_says_if_its_sign_holds(tmp_path):
    good, bad = BETTER8, [v - 0.1 for v in BASE8]
    rows = tuned("resnet", {1e-3: BASE8, 1e-2: BASE8}, {1e-3: 0.5, 1e-2: 0.4})
    rows += tuned("ddl", {1e-3: bad, 1e-2: good}, {1e-3: 0.3, 1e-2: 0.9})
    report = dd.build_report(store_rows(tmp_path, rows))
    [c] = report.comparisons
    # each its own best val, at an end of its two values (as any choice of two is)
    assert (c.chosen, c.control_chosen) == ("lr=0.01 (grid edge)", "lr=0.001 (grid edge)")
    assert c.label == "win" and c.paired.mean == pytest.approx(0.3, abs=0.02)
    assert c.grid == (("lr=0.001", False), ("lr=0.01", True)) and c.grid_holds is False
    md = render(report)
    assert "| flips at lr=0.001 |" in md
    assert "| lr=0.01 (grid edge) / lr=0.001 (grid edge) |" in md
    table = {r.model: r for r in report.tables[0].rows}
    assert table["ddl"].chosen == "lr=0.01 (grid edge)" and table["ddl"].test.mean == pytest.approx(
        sum(good) / 8
    )
    assert table["ddl"].run == 8  # the row's seeds at its chosen value, not the whole grid


def test_a_grid_value_whose_seeds_fail_is_not_chosen_over_one_that_finishes(tmp_path):
    rows = tuned("resnet", {1e-3: BASE8, 1e-1: BASE8}, {1e-3: 0.5, 1e-1: 0.9})
    for r in rows[8:9]:  # lr = 0.1 diverged on one seed, although its mean val is best
        r.status = "diverged"
    report = dd.build_report(store_rows(tmp_path, rows))
    assert report.tables[0].rows[0].chosen == "lr=0.001 (grid edge)"


def test_a_retried_failure_stays_visible(tmp_path):
    first = row("ddl", 0, None, status="diverged", message="loss became nan at step 9")
    rows = [*seeds("resnet", RESNET), first, *seeds("ddl", DDL)]
    report = dd.build_report(store_rows(tmp_path, rows))
    ddl = next(r for r in report.tables[0].rows if r.model == "ddl")
    assert ddl.retries == 1 and ddl.statuses == {"ok": 3}
    md = render(report)
    assert "| 3/3, 1 retried |" in md
    assert "`ddl` seed 0: **diverged, then retried** — loss became nan at step 9" in md


def test_only_the_newest_config_of_a_row_is_shown_and_the_rest_is_counted(tmp_path):
    old = seeds("ddl", [0.1, 0.1, 0.1], train={"steps": 60})
    for r in old:
        r.key += "-old"
    store_rows(tmp_path, seeds("resnet", RESNET, train={"steps": 150}) + old)
    store_rows(tmp_path, seeds("ddl", DDL, train={"steps": 150})[:2])  # rerun, two seeds
    table = dd.build_report(tmp_path).tables[0]
    ddl = next(r for r in table.rows if r.model == "ddl")
    assert ddl.per_seed == {0: 0.90, 1: 0.95} and ddl.older == 3
    assert any(
        p.status == "older config left out" and "3 cell(s)" in p.message for p in table.problems
    )


def test_declared_comparisons_are_drawn_beside_the_baseline(tmp_path):
    config = (
        'name = "demo"\n[[comparisons]]\nmodel = "ddl"\ncontrol = "ddl-write"\n'
        '[[comparisons]]\nmodel = "ddl"\ncontrol = "resnet"\nsplit = "long"\n'
        "requires = 0.99\n"
    )
    rows = seeds("resnet", BASE8) + seeds("ddl", BETTER8) + seeds("ddl-write", BASE8)
    report = dd.build_report(store_rows(tmp_path, rows, config))
    found = {(c.model, c.control, c.split): c for c in report.comparisons}
    assert found["ddl", "ddl-write", "test"].kinds == ("declared",)
    assert found["ddl", "ddl-write", "test"].label == "win"
    # the OOD comparison needs both rows to have solved the trained split: neither did
    moved = found["ddl", "resnet", "test"]
    assert moved.kinds == ("baseline",) or moved.asked_split == "long"
    ood = [c for c in report.comparisons if c.asked_split == "long"]
    assert len(ood) == 1 and (
        "long not judged: ddl reached test accuracy ≥ 0.99 on 0 of 8" in ood[0].note
    )


def test_reconstruction_flag_marks_the_row_and_the_verdict(tmp_path):
    rows = [row("resnet", s, 0.5 + 0.01 * s) for s in range(3)]
    for s in range(3):
        r = row("node", s, 0.6 + 0.02 * s)
        r.metrics |= {
            "reconstruction_error": 0.2,
            "reconstruction_tolerance": 0.01,
            "reconstruction_flag": s == 1,
        }
        rows.append(r)
    report = dd.build_report(store_rows(tmp_path, rows))
    node = next(r for r in report.tables[0].rows if r.model == "node")
    assert node.flagged == (1,)
    assert "⚑ node: ODE reconstruction failed on seed(s) 1" in report.comparisons[0].note
    md = render(report, "md")
    assert "| node ⚑ |" in md and "⚑ node: on seed(s) 1 the ODE reconstruction error" in md


def test_stored_baselines_override_the_default(tmp_path):
    rows = [row("resnet", s, 0.5, baseline=None) for s in range(3)]
    rows += [row("resnet-tied", s, v, baseline=None, params=50) for s, v in enumerate(RESNET)]
    rows += [row("ddl-tied", s, v, baseline="resnet-tied", params=55) for s, v in enumerate(DDL)]
    rows += [row("node", s, 0.6) for s in range(3)]  # stored without the key: resnet
    report = dd.build_report(store_rows(tmp_path, rows))
    assert {(c.model, c.control) for c in report.comparisons} == {
        ("ddl-tied", "resnet-tied"),
        ("node", "resnet"),
    }
    rows = {r.model: r for r in report.tables[0].rows}
    assert rows["ddl-tied"].params_ratio == pytest.approx(1.1)
    assert [r.model for r in report.tables[0].rows][:2] == ["resnet", "resnet-tied"]


def test_markdown_opens_with_a_summary_then_the_verdicts(run_dir):
    md = render(dd.build_report(run_dir), "md")
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Summary", "## Verdicts"]
    summary = md.split("## Summary")[1].split("## Verdicts")[0]
    assert "comparisons" in summary and "inconclusive" in summary
    assert sections.index("## Results per task") > 0
    assert "| parity (accuracy ↑) | ddl | resnet | — | +0.403 ± " in md
    assert "| inconclusive (n = 3 of 5" in md and "ddl fails 2/5" in md
    assert "### parity (accuracy ↑)" in md  # its rows name no task config: no floor
    assert "| ddl | 3/5 (60%) | 0.9267 ± " in md and "| 0.9, 0.95, 0.93, diverged, capped |" in md
    assert "| 0.6 |" in md  # n = 1: a bare mean, no interval
    assert "**diverged** — loss became nan at step 7" in md and "**failed**" in md
    assert "3 ok, 1 capped, 1 diverged" in md and "(1.10×)" in md


def test_csv_is_one_line_per_cell_and_json_leads_with_the_verdicts(run_dir):
    report = dd.build_report(run_dir)
    text = render(report, "csv")
    head = text.splitlines()[0].split(",")
    assert head[:6] == ["task", "model", "seed", "chosen", "status", "message"]
    cells = list(csv.DictReader(io.StringIO(text)))
    assert len(cells) == 12  # resnet 5, ddl 5, node 2: every seed its own line
    ddl = {int(c["seed"]): c for c in cells if c["model"] == "ddl"}
    assert [ddl[s]["test"] for s in range(3)] == ["0.9", "0.95", "0.93"]
    assert ddl[3]["status"] == "diverged" and ddl[4]["status"] == "capped"
    assert ddl[0]["ood/long"] == "0.8" and ddl[0]["params"] == "110"

    def reject(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(render(report, "json"), parse_constant=reject)
    sections = [k for k in data if k in ("comparisons", "expectations", "tables")]
    assert sections == ["comparisons", "expectations", "tables"]
    assert data["comparisons"][0]["model"] == "ddl"
    assert data["comparisons"][0]["label"] == "inconclusive"
    assert data["tables"][0]["rows"][0]["model"] == "resnet"
    with pytest.raises(ValueError, match="unknown report format"):
        render(report, "pdf")


def test_missing_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere: no such run folder"):
        dd.build_report(tmp_path / "nowhere")


def test_a_report_during_a_run_says_it_is_unfinished(tmp_path):
    store = dd.RunFolder.open(tmp_path, "w").store
    keys = [f"parity-{m}-{s}" for m in ("resnet", "ddl") for s in range(3)] + ["x", "y"]
    run = store.start_run("demo", 'name = "demo"', cells=keys)
    for r in [*seeds("resnet", RESNET), *seeds("ddl", DDL)]:
        store.put(r)
    first = dd.build_report(tmp_path)
    assert first.progress == "6 of 8 cells; run unfinished"
    assert "cells: 6 ok (6 of 8 cells; run unfinished)." in render(first)
    store.finish_run(run)
    assert dd.build_report(tmp_path).progress == "6 of 8 cells"  # ended, two never stored


def test_a_report_without_any_grid_says_its_verdicts_rest_on_fixed_rates(run_dir, tmp_path):
    assert "No row was tuned" not in render(
        dd.build_report(
            store_rows(
                tmp_path / "tuned",
                tuned("resnet", {1e-3: BASE8, 1e-2: BASE8}, {1e-3: 0.5, 1e-2: 0.4}),
            )
        )
    )
    assert "**No row was tuned: every row trained at the rates" in render(dd.build_report(run_dir))


def test_reports_lead_with_the_run_and_a_summary(tiny_study):
    from ddl_dynamics.analysis.render.html import render_html

    report = dd.build_report(tiny_study)
    md = render(report, "md").splitlines()
    assert md[2] == "a tiny study for the tests: 2 tasks, 2 models, 3 seeds, 20 steps"
    page = render_html(report)
    assert "<th></th>" not in page  # the run-info table has no empty header row
    assert (
        page.index('<nav class="toc">')
        < page.index('<h2 id="summary">')
        < page.index('<h2 id="verdicts">')
        < page.index('<h2 id="results-per-task">')
    )
    assert page.count("<table") == page.count('<div class="wide"><table')  # tables scroll
    assert "no difference detected" in page.split('<h2 id="verdicts">')[0]


def test_the_html_report_keeps_p_values_whole_and_opens_with_the_file_it_ran(tmp_path):
    """p-values once broke inside their digits ("0.2 / 50") and the experiment file ran off
    the page at the report's end."""
    from ddl_dynamics.analysis.render.html import render_html

    store = dd.RunFolder.open(tmp_path, "w").store
    text = 'name = "demo"\ndescription = "' + "a long line " * 40 + '"\n'
    store.start_run("demo", text)
    for seed, (a, b) in enumerate(zip(RESNET, DDL, strict=True)):
        store.put(row("resnet", seed, a))
        store.put(row("ddl", seed, b, params=110))
    page = render_html(dd.build_report(tmp_path))
    assert '<th class="p">p</th><th class="p">p Holm</th>' in page
    assert '<td class="p">0.250 (flip)</td><td class="p">—</td>' in page
    assert ".p { white-space: nowrap; }" in page and "td { overflow-wrap: anywhere" not in page
    folded = (
        '<details class="config"><summary>Experiment file, as run</summary>'
        f"<pre>name = &quot;demo&quot;\ndescription = &quot;{'a long line ' * 40}"
    )
    assert folded in page and "white-space: pre-wrap" in page
    assert page.index(folded) < page.index('<nav class="toc">')  # what ran, before the rest


def test_a_task_table_names_its_floor_beside_its_metric():
    assert metric_title("parity", "accuracy", True, 0.5) == "parity (accuracy ↑, floor 0.5)"
    assert metric_title("overwrite", "mse", False, None) == "overwrite (mse ↓)"
    var_chain = dd.make_task("var-chain", hops=3)
    title = metric_title("var-chain", "accuracy", True, var_chain.floor)
    assert title == f"var-chain (accuracy ↑, floor {var_chain.floor:.3g})"
