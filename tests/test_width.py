"""Accuracy against model width: the panels a run's width sweeps make, their points at each
row's chosen rate, the solved mark, and the crossover over hops kept apart per width."""

import dataclasses
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ddl_dynamics as dd
from ddl_dynamics.analysis.figures import NothingToDraw, width_figures
from ddl_dynamics.analysis.judge.crossover import curve
from ddl_dynamics.analysis.judge.stats import Estimate
from ddl_dynamics.analysis.judge.width import (
    SOLVED,
    WidthPanel,
    WidthPoint,
    smallest_solving,
    width_panels,
)
from ddl_dynamics.analysis.plots.sweeps import crossover, width_sweep
from ddl_dynamics.analysis.report.build import build_report
from ddl_dynamics.analysis.run import load_run, run_of
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.cells import expand_cells
from ddl_dynamics.experiment.folder import RunFolder
from ddl_dynamics.experiment.reader import load_experiment

#: var-chain swept over hops at widths 8 and 16, a reassign task at 16 only (in no panel);
#: two rows, 2 seeds, two learning rates, 10 steps: 40 cells, a few seconds.
WIDTHS = """
name = "width-tiny"
description = "var-chain at two widths"
seeds = [0, 1]
baseline = "transformer"
[defaults.model]
depth = 2
heads = 2
[defaults.train]
steps = 10
batch_size = 16
eval_every = 5
n_train = 64
n_val = 32
n_test = 32
[defaults.tune]
lr = [1e-3, 1e-2]
[[tasks]]
name = "var-chain"
label = "var-chain-w8"
spec = { hops = [1, 2] }
model = { width = 8 }
[[tasks]]
name = "var-chain"
label = "var-chain-w16"
spec = { hops = [1, 2] }
model = { width = 16 }
[[tasks]]
name = "var-chain"
label = "var-chain-w16-reassign"
spec = { hops = 2, reassign = true }
model = { width = 16 }
[[models]]
name = "transformer"
[[models]]
name = "ddl-transformer"
label = "ddl-dv1"
"""


@pytest.fixture(scope="module")
def width_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("width")
    experiment = root / "widths.toml"
    experiment.write_text(textwrap.dedent(WIDTHS))
    run_dir = root / "run"
    assert main(["run", str(experiment), "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_a_panel_is_one_task_setting_at_every_width(width_run):
    panels = width_panels(load_run(width_run))
    assert [p.title for p in panels] == ["var-chain, hops=1", "var-chain, hops=2"]
    for panel, hops in zip(panels, (1, 2), strict=True):
        assert (panel.metric, panel.higher_is_better) == ("accuracy", True)
        assert set(panel.rows) == {"transformer", "ddl-dv1"}
        for points in panel.rows.values():
            assert [(p.width, p.task) for p in points] == [
                (8, f"var-chain-w8[hops={hops}]"),
                (16, f"var-chain-w16[hops={hops}]"),
            ]


def test_each_point_is_the_reports_test_metric_at_the_chosen_rate(width_run):
    run = load_run(width_run)
    tables = {t.task: {r.model: r for r in t.rows} for t in build_report(run).tables}
    stored = RunFolder.open(width_run).store.rows()
    checked = 0
    for panel in width_panels(run):
        for label, points in panel.rows.items():
            for p in points:
                reported = tables[p.task][label]
                assert p.chosen == reported.chosen and p.chosen.startswith("lr=")
                lr = run.rows[p.task, label].chosen[0]
                tests = [
                    r.metrics["test"]
                    for r in stored
                    if (r.task, r.model) == (p.task, label) and r.config["train"]["lr"] == lr
                ]
                assert len(tests) == p.run == 2 and p.failed == 0
                assert p.test.mean == pytest.approx(np.mean(tests))
                assert (p.test.mean, p.test.ci) == (reported.test.mean, reported.test.ci)
                checked += 1
    assert checked == 8  # 2 panels × 2 rows × 2 widths


def test_failed_seeds_are_counted_and_named_in_the_legend(width_run):
    cells = RunFolder.open(width_run).store.rows()
    failing = [
        dataclasses.replace(c, status="diverged")
        if (c.task, c.model, c.seed) == ("var-chain-w8[hops=1]", "transformer", 0)
        else c
        for c in cells
    ]
    panel = width_panels(run_of(failing, experiment={}))[0]
    low, high = panel.rows["transformer"]
    assert (low.failed, low.run, low.test.n, high.failed) == (1, 2, 1, 0)
    legend = [t.get_text() for t in width_sweep([panel]).axes[0].get_legend().get_texts()]
    assert any(t.startswith("transformer") and "1 of 4 seeds failed" in t for t in legend)
    assert not any("failed" in t for t in legend if t.startswith("ddl-dv1"))


def points(means, widths=(8, 16, 32, 64)):
    return tuple(
        WidthPoint(w, f"t-w{w}", Estimate(m, 0.01, 8) if m is not None else Estimate(), 0, 8, "")
        for w, m in zip(widths, means, strict=True)
    )


def test_the_solved_mark_is_the_smallest_width_whose_mean_reaches_it():
    assert smallest_solving(points([0.5, 0.995, 0.98, 1.0])) == 16  # not undone by a dip
    assert smallest_solving(points([0.5, 0.98, SOLVED, 1.0])) == 32  # reaching it counts
    assert smallest_solving(points([None, 0.9, 0.989, 0.98])) is None
    assert smallest_solving(points([0.5, 1.0, 1.0, 1.0]), higher_is_better=False) is None
    panel = WidthPanel(
        "t",
        "",
        "accuracy",
        True,
        {"a": points([0.5, 0.995, 0.98, 1.0]), "b": points([0.1, 0.2, 0.3, 0.4])},
    )
    ax = width_sweep([panel]).axes[0]
    stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1 and stars[0].get_xdata()[0] == pytest.approx(16, rel=0.05)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"a; reaches {SOLVED:g} from width 16", f"b; reaches {SOLVED:g} at no width"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16", "32", "64"]


def test_plot_width_writes_the_figure(width_run, capsys):
    assert main(["plot", "width", str(width_run)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(p.rsplit("/", 1)[1] for p in written) == [
        "width_var-chain.png",
        "width_var-chain.svg",
    ]
    for path in written:
        data = Path(path).read_bytes()
        assert data.startswith(b"\x89PNG") if path.endswith(".png") else b"<svg" in data[:2000]


def test_a_run_without_a_width_sweep_has_nothing_to_draw(width_run, tmp_path, capsys):
    one_width = [
        c for c in RunFolder.open(width_run).store.rows() if c.task.startswith("var-chain-w16")
    ]
    run = run_of(one_width, experiment={}, run_dir=tmp_path)
    assert width_panels(run) == []
    with pytest.raises(NothingToDraw, match="no width sweep"):
        width_figures(run, build_report(run), {})
    store = dd.RunFolder.open(tmp_path, "w").store
    store.start_run("one-width", "")
    for cell in one_width:
        store.put(cell)
    assert main(["plot", "width", str(tmp_path)]) == 1
    assert "nothing to draw for width: no width sweep" in capsys.readouterr().err


def test_the_crossover_follows_hops_at_each_width_apart(width_run):
    found = build_report(load_run(width_run)).crossovers
    assert {(c.setting.knob, c.setting.label, c.model, c.control) for c in found} == {
        ("hops", f"width={w}", "ddl-dv1", "transformer") for w in (8, 16)
    }
    for c in found:  # each curve from one width's tasks
        assert [v for v, _ in c.points] == [1, 2]
        width = c.setting.label.rsplit("=", 1)[1]
        assert {p.task for _, p in c.points} == {f"var-chain-w{width}[hops={h}]" for h in (1, 2)}
    drawn = {
        c.setting.label: {
            f"{c.model} − {c.control}": (
                curve([(v, p.paired) for v, p in c.points if p.paired]),
                2.0,
            )
        }
        for c in found
    }
    ax = crossover(drawn, {}, "hops", "accuracy", True).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    assert ax.get_legend().get_texts()[0].get_text() == "ddl-dv1 − transformer: hops* = 2"


@pytest.mark.slow  # the depth study's cells drawn whole: in the slow run, which CI runs
def test_the_depth_study_draws_three_width_panels_and_a_crossover_per_width():
    """``experiments/transformer-depth.toml``, its cells given made-up metrics (nothing
    trained): the panels and the crossovers its figures draw."""
    path = Path(__file__).parents[1] / "experiments" / "transformer-depth.toml"
    cells = expand_cells(load_experiment(path), seeds=[0, 1, 2])
    values = np.random.default_rng(0).random((len(cells), 2))
    rows = [
        dd.RunResult(
            status="ok",
            key=c.key,
            task=c.task_label,
            model=c.label,
            seed=c.seed,
            params=100,
            config=c.to_dict(),
            metrics={"metric": "accuracy", "higher_is_better": True, "val": val, "test": test},
        )
        for c, (val, test) in zip(cells, values, strict=True)
    ]
    run = run_of(rows, experiment={"config": path.read_text()})
    labels = ["additive-dv4", "ddl-dv1", "ddl-dv4", "ddl-write-dv1", "transformer"]
    panels = width_panels(run)
    assert [p.title for p in panels] == [
        "var-chain, hops=1, reassign=False",
        "var-chain, hops=4, reassign=False",
        "var-chain, hops=4, reassign=True",
    ]
    for panel in panels:
        assert list(panel.rows) == labels
        assert [p.width for p in panel.rows["transformer"]] == [16, 32, 64]
    found = {
        (c.setting.label, c.model, c.control): [v for v, _ in c.points]
        for c in build_report(run).crossovers
    }
    for pair in (
        ("ddl-dv1", "transformer"),
        ("ddl-dv1", "ddl-write-dv1"),
        ("ddl-dv4", "additive-dv4"),
    ):
        assert found["width=32", *pair] == [1, 2, 3, 4]
        assert found["width=16", *pair] == found["width=64", *pair] == [1, 4]
