"""Probes, regime analysis, figures, expectation checks and the HTML report."""

import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

import ddl_dynamics as dd
from ddl_dynamics.analysis.figures import FIGURE_KINDS, make_figures
from ddl_dynamics.analysis.judge.regimes import contraction, depth_determinant, regime_fractions
from ddl_dynamics.analysis.plots.depth import phase_portraits
from ddl_dynamics.analysis.plots.gates import (
    beta_histograms,
    determinant_plot,
    probe_consistency,
    query_regimes,
    regime_atlas,
)
from ddl_dynamics.analysis.plots.style import row_colors
from ddl_dynamics.analysis.plots.summary import MARK_COLORS, comparison, verdict_matrix
from ddl_dynamics.analysis.plots.sweeps import hop_gates
from ddl_dynamics.analysis.plots.training import nfe_curves, training_curves
from ddl_dynamics.analysis.probes import probe_model
from ddl_dynamics.analysis.render.formats import render
from ddl_dynamics.analysis.run import load_run
from ddl_dynamics.cli import main
from ddl_dynamics.models.operator import gate_logit

PLANTED = (2.0, 1.0, 0.0, 1.5)  # reflection, projection, identity, over-relaxed


def planted_ddl(task):
    """A DDL stack whose gate on layer i is PLANTED[i] for every sample."""
    model = dd.make_model(
        "ddl",
        in_dim=task.in_dim,
        out_dim=task.out_dim,
        control_dim=task.control_dim,
        width=8,
        depth=len(PLANTED),
    )
    with torch.no_grad():
        for i, beta in enumerate(PLANTED):
            out = model.layer(i).branch.out
            out.weight[model.d].zero_()
            # β = 2σ(logit); ±30 saturates the sigmoid to within 1e-13 of 0 or 2
            out.bias[model.d] = (
                30.0 if beta == 2.0 else -30.0 if beta == 0.0 else (gate_logit(beta))
            )
    return model.eval()


def test_planted_gates_give_the_expected_atlas():
    task = dd.make_task("parity", depth=len(PLANTED))
    arrays = probe_model(task, planted_ddl(task), seed=0, n=64)
    np.testing.assert_allclose(arrays["beta"], np.broadcast_to(PLANTED, (64, 4)), atol=1e-6)
    fractions = regime_fractions(arrays["beta"])  # (layers, regimes)
    expected = np.zeros((4, len(dd.REGIMES)))
    for layer, regime in enumerate(("reflection", "projection", "identity", "over-relaxed")):
        expected[layer, dd.REGIMES.index(regime)] = 1.0
    np.testing.assert_array_equal(fractions, expected)
    # One reflecting layer (β=2) and one over-relaxed (β=1.5): det = (−1)(0)(1)(−0.5) = 0
    # exactly at the projection; without the projection layer the sign is positive.
    beta = arrays["beta"]
    assert np.allclose(depth_determinant(beta), 0.0, atol=1e-6)
    assert (depth_determinant(beta[:, [0, 2, 3]]) > 0).all()
    assert (depth_determinant(beta[:, [0, 2]]) < 0).all()


def test_discrepancy_contracts_by_one_minus_beta_in_a_trained_stack():
    task = dd.make_task("overwrite", depth=4)
    torch.manual_seed(0)
    model = dd.make_model(
        "ddl",
        in_dim=task.in_dim,
        out_dim=task.out_dim,
        control_dim=task.control_dim,
        width=8,
        depth=4,
    )
    cfg = dd.TrainConfig(steps=40, batch_size=64, n_train=256, n_test=128, eval_every=40)
    assert dd.train(task, model, cfg, seed=0).status == "ok"
    arrays = probe_model(task, model.eval(), seed=0, n=128)
    measured = contraction(arrays["e_pre"], arrays["e_post"])
    expected = np.abs(1 - arrays["beta"])
    ok = np.isfinite(measured)
    assert ok.mean() > 0.9
    np.testing.assert_allclose(measured[ok], expected[ok], atol=1e-4)
    # The write-only control has no such contraction: its readout keeps the old value.
    write = dd.make_model(
        "ddl-write",
        in_dim=task.in_dim,
        out_dim=task.out_dim,
        control_dim=task.control_dim,
        width=8,
        depth=4,
    )
    arrays = probe_model(task, write.eval(), seed=0, n=128)
    ratio = contraction(arrays["e_pre"], arrays["e_post"])
    assert np.nanmax(np.abs(ratio - np.abs(1 - arrays["beta"]))) > 1e-2


TINY = """
name = "tiny"
seeds = [0, 1]
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 20
eval_every = 10
batch_size = 32
n_train = 128
n_test = 64
[[tasks]]
name = "oscillator"
[[tasks]]
name = "parity"
[[tasks]]
name = "switched"
spec = { event = "reflect", p = [0, 1] }
[[models]]
name = "resnet"
[[models]]
name = "node"
[[models]]
name = "ddl"
tied = true
[[models]]
name = "ddl"
label = "ddl-bmax1"
tied = true
beta_max = 1.0
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    experiment = root / "tiny.toml"
    experiment.write_text(textwrap.dedent(TINY))
    run_dir = root / "run"
    assert main(["run", str(experiment), "--run-dir", str(run_dir)]) == 0
    return run_dir


# hops: test_hops.py; queries: test_swap_track.py; width: test_width.py
@pytest.mark.parametrize("kind", [k for k in FIGURE_KINDS if k not in ("hops", "queries", "width")])
def test_every_plot_command_writes_images(tiny_run, kind, capsys):
    assert main(["plot", kind, str(tiny_run)]) == 0
    written = capsys.readouterr().out.split()
    assert written and any(p.endswith(".png") for p in written)
    for path in written:
        data = Path(path).read_bytes()
        assert len(data) > 1000
        assert data.startswith(b"\x89PNG") if path.endswith(".png") else b"<svg" in data[:2000]


def test_probes_are_cached_and_plotting_never_retrains(tiny_run):
    from ddl_dynamics.analysis.probes import probe_run

    probe_run(tiny_run, progress=False)  # whichever plots ran before in this process
    probes = sorted((tiny_run / "probes").glob("*.npz"))
    assert len(probes) == 32  # 4 tasks × 4 models × 2 seeds
    stamps = [p.stat().st_mtime_ns for p in probes]
    assert main(["plot", "regimes", str(tiny_run)]) == 0
    assert [p.stat().st_mtime_ns for p in probes] == stamps


def test_report_judges_expectations_and_audits_regimes(tiny_run):
    report = dd.build_report(tiny_run)
    verdicts = {(v.task, v.claim): v for v in report.expectations}
    # A tied ddl is far smaller than the untied resnet: no test; the linear recurrence of
    # parity's claim was not run.
    oscillator = verdicts["oscillator", "ddl worse than resnet on test"]
    assert (oscillator.model, oscillator.control) == ("ddl", "resnet")  # not ddl-bmax1
    assert oscillator.verdict == "insufficient evidence"
    assert oscillator.comparison.label == "unmatched size"
    assert "parameters" in oscillator.note and "more than 10% apart" in oscillator.note
    (parity,) = [v for v in report.expectations if v.task == "parity"]
    assert parity.verdict == "insufficient evidence" and parity.note.startswith("no cell of")
    rows = {(r.task, r.model): r for r in report.regimes}
    tasks = ("oscillator", "parity", "switched[p=0]", "switched[p=1]")
    assert set(rows) == {(t, m) for t in tasks for m in ("ddl", "ddl-bmax1")}
    for row in rows.values():
        assert sum(row.fractions.values()) == pytest.approx(1.0)
        assert row.dominant == max(row.fractions, key=row.fractions.get)
    assert rows["parity", "ddl"].stated == ("over-relaxed", "reflection")
    # β_max = 1 cannot reach the over-relaxed or reflection regimes at all.
    bmax1 = rows["parity", "ddl-bmax1"].fractions
    assert bmax1["over-relaxed"] == bmax1["reflection"] == 0.0
    text = render(report, "md")
    assert "## Expectations against the measured seeds" in text
    assert "| insufficient evidence | ddl has " in text


def test_verdict_matrix_colours_each_mark():
    cells = {
        "overwrite": {
            "ddl": ("win", "-0.4 ± 0.1"),
            "ddl-write": ("loss", "+0.2 ± 0.1"),
            "gated": ("equivalent", "+0.01 ± 0.01"),
        },
        "parity": {
            "ddl": ("inconclusive", "+0.01 ± 0.3"),
            "node": ("unequal budget", "no test"),
            "gated": ("unmatched size", "no test"),
            "ddl-lin": ("both solved", "+0 ± 0"),
            "ddl-write": ("fails", "—"),
        },
        "var-chain": {"ddl": ("both at floor", "+0 ± 0")},
    }
    fig = verdict_matrix(cells)
    ax = fig.axes[0]
    drawn = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches}
    expected = {tuple(round(c, 3) for c in to_rgb(color)) for color in MARK_COLORS.values()}
    assert drawn == expected and len(ax.patches) == 9  # (overwrite, node) stays blank
    texts = {t.get_text() for t in ax.texts}
    assert "win\n-0.4 ± 0.1" in texts and "unequal budget\nno test" in texts
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 2  # no test drawn
    assert [t.get_text() for t in ax.get_yticklabels()] == ["overwrite", "parity", "var-chain"]


@pytest.mark.slow  # over 10 s on 2 cores
def test_html_report_is_self_contained(tiny_run):
    assert main(["report", str(tiny_run), "--format", "html"]) == 0
    page = (tiny_run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') >= 8
    assert "http://" not in page and "https://" not in page
    for section in ("Expectations", "Gate regimes", "oscillator", "parity", "torch"):
        assert section in page
    # A summary with the verdict matrix opens the report, the verdict table comes next.
    order = [
        page.index(s)
        for s in (
            '<h2 id="summary">',
            'alt="verdicts"',
            '<h2 id="verdicts">',
            '<h2 id="expectations',
            '<h2 id="crossover">',
            'alt="crossover_switched"',
            '<h2 id="results-per-task">',
            '<h2 id="figures">',
        )
    ]
    assert order == sorted(order) and page.count('alt="verdicts"') == 1
    assert page.count('alt="crossover_switched"') == 1 and "none in range" in page
    assert (tiny_run / "figures" / "verdicts.png").is_file()
    assert "probe_consistency" in page and "not evidence about training" in page


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (apt-get install chromium)",
)
def test_html_report_renders_in_headless_chromium(tiny_run, tmp_path):
    page = tiny_run / "report.html"
    if not page.exists():
        assert main(["report", str(tiny_run), "--format", "html"]) == 0
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        ["chromium", *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<img") == page.read_text().count("<img")
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr
    subprocess.run(
        ["chromium", *flags, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = shot.read_bytes()
    assert pixels.startswith(b"\x89PNG") and len(pixels) > 20_000  # not a blank page


DOTTED = """
name = "dotted"
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 10
eval_every = 5
batch_size = 32
n_train = 64
n_test = 32
[[tasks]]
name = "oscillator"
spec = { horizon = [1.5, 1.25] }
[[models]]
name = "ddl"
label = "ddl-b0.5"
beta_max = 0.5
beta_init = 0.1
[[models]]
name = "ddl"
label = "ddl-b0.25"
beta_max = 0.25
beta_init = 0.1
"""


@pytest.fixture(scope="module")
def dotted_run(tmp_path_factory):
    """A run whose labels, models' and tasks' alike, differ after their last dot."""
    root = tmp_path_factory.mktemp("dotted")
    (root / "dotted.toml").write_text(DOTTED)
    assert main(["run", str(root / "dotted.toml"), "--run-dir", str(root / "run")]) == 0
    return root / "run"


def test_labels_that_differ_after_a_dot_get_a_figure_each(dotted_run, capsys):
    assert main(["plot", "all", str(dotted_run)]) == 0
    written = capsys.readouterr().out.split()
    names = {Path(path).name for path in written}
    for stem in (
        "regime_atlas_ddl-b0.5",
        "regime_atlas_ddl-b0.25",
        "trajectories_oscillator[horizon=1.5]",
        "trajectories_oscillator[horizon=1.25]",
    ):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    assert len(names) == len(written) == len(list((dotted_run / "figures").iterdir()))


@pytest.mark.slow  # over 8 s on 2 cores
def test_a_probe_cut_short_counts_as_missing(dotted_run, capsys):
    """A probe file written only in part (by a process killed mid-write before files were
    renamed into place) or damaged is probed again, by the report that shows it (its
    regime table) as by a plot, and read by nothing meanwhile."""
    assert main(["plot", "regimes", str(dotted_run)]) == 0
    probes = sorted((dotted_run / "probes").glob("*.npz"))
    for command in ("report", "plot"):
        cut, empty = probes[:2]
        cut.write_bytes(cut.read_bytes()[:200])
        empty.write_bytes(b"")
        argv = (
            ["report", str(dotted_run)]
            if command == "report"
            else ["plot", "regimes", str(dotted_run)]
        )
        assert main(argv) == 0
        assert command == "plot" or "ddl-b0.5" in capsys.readouterr().out
        for path in (cut, empty):
            with np.load(path) as arrays:
                assert arrays["beta"].shape[1] == 3  # every layer's gate, again


@pytest.mark.slow  # over 10 s on 2 cores
def test_a_plot_killed_while_probing_leaves_a_run_the_html_report_takes(dotted_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(dotted_run, run, ignore=shutil.ignore_patterns("probes", "figures"))
    plot = subprocess.Popen(
        [sys.executable, "-m", "ddl_dynamics.cli", "plot", "regimes", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probes = run / "probes"
    while plot.poll() is None and not (probes.is_dir() and any(probes.iterdir())):
        time.sleep(0.001)
    plot.kill()  # as the first probe is being written
    assert plot.wait() == -signal.SIGKILL
    for path in probes.glob("*.npz"):  # whole, or not there
        with np.load(path) as arrays:
            assert "beta" in arrays
    report = subprocess.run(
        [sys.executable, "-m", "ddl_dynamics.cli", "report", str(run), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr
    assert (run / "report.html").read_text().count('alt="regime_atlas_ddl-b0.') == 2
    assert len(list(probes.glob("*.npz"))) == 4


# --- Figures that do not mislead: inspected as Figure objects, not as pixels.


def _drawn(fig):
    """Lay the figure out as it would be saved (text extents need a renderer)."""
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def _overlap(boxes) -> bool:
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def _legend_colors(fig) -> dict[str, tuple]:
    """Model label → colour, from every legend of a figure (the figure's and its axes')."""
    found = {}
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
            found[text.get_text()] = to_rgb(handle.get_color())
    return found


def test_an_nfe_row_evaluated_once_shows_as_a_marker_on_an_axis_from_step_0():
    curves = {
        "sign-flip": {
            "node": [np.array([[50.0, 56.0]]), np.array([[50.0, 62.0]])],
            "anode": [np.array([[50.0, 80.0]])],
        }
    }
    fig = nfe_curves(curves)
    ax = fig.axes[0]
    points = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(points) == 2 and all(len(line.get_xdata()) == 1 for line in points)
    low, high = ax.get_xlim()
    assert low <= 0 and high >= 50 and high < 60


def test_training_curves_have_one_legend_outside_the_axes_with_every_entry_drawn():
    steps = np.arange(0, 301, 100.0)
    curves = {
        "overwrite": {
            "resnet": [np.c_[steps, [1.0, 0.5, 0.4, 0.3]]],
            "ddl": [np.c_[steps, [1.0, 0.1, 0.01, 0.002]]],
        },
        "sign-flip": {
            "node": [np.array([[50.0, 1.08]])],  # evaluated once
            "anode": [np.c_[steps, [np.nan] * 4]],
        },
    }  # nothing finite
    metric = {"overwrite": "mse", "sign-flip": "mse"}
    fig = training_curves(curves, metric)
    renderer = _drawn(fig)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    legend = fig.legends[0]
    assert sorted(t.get_text() for t in legend.get_texts()) == ["ddl", "node", "resnet"]
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    (node,) = [line for line in fig.axes[1].get_lines() if line.get_marker() == "o"]
    assert list(node.get_xdata()) == [50.0]
    assert "not drawn: anode on sign-flip" in legend.get_title().get_text()


def test_flops_and_log_ticks_do_not_overlap():
    flops = np.linspace(1.1e12, 3.4e12, 20)  # less than a decade: matplotlib labels minors
    curves = {
        "overwrite": {
            m: [np.c_[flops * f, np.geomspace(1, 1e-3, 20) * f]]
            for m, f in (("resnet", 1.0), ("ddl", 1.3))
        }
    }
    fig = training_curves(curves, {"overwrite": "mse"}, x="FLOPs")
    renderer = _drawn(fig)
    ax = fig.axes[0]
    labels = [
        t
        for t in [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)]
        if t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]
    ]
    assert len(labels) >= 2
    assert not _overlap([t.get_window_extent(renderer) for t in labels])


def test_compare_ticks_do_not_overlap_and_intervals_stay_in_the_metric_range():
    names = [
        "resnet",
        "ddl",
        "ddl-write",
        "ddl-bmax1",
        "resnet-tied",
        "ddl-tied",
        "ddl-tied-bmax1",
        "ddl-lin",
        "ddl-lin-bmax1",
        "node",
        "anode",
    ]
    mse = {
        m: (0.01 * (i + 1), 0.05, [0.001 * (i + 1), 0.02 * (i + 1)]) for i, m in enumerate(names)
    }
    acc = {m: (0.98, 0.05, [0.95, 1.0]) for m in names}
    fig = comparison({"overwrite": mse, "parity": acc}, {"overwrite": "mse", "parity": "accuracy"})
    renderer = _drawn(fig)
    for ax in fig.axes:
        labels = [t for t in [*ax.get_xticklabels(), *ax.get_yticklabels()] if t.get_text()]
        assert not _overlap([t.get_window_extent(renderer) for t in labels])
    mse_ax, acc_ax = fig.axes
    assert mse_ax.get_xscale() == "log"
    for ax, (low, high) in ((mse_ax, (0.0, np.inf)), (acc_ax, (0.0, 1.0))):
        ends = np.concatenate([c.lines[2][0].get_segments() for c in ax.containers])
        values = ends[..., 0]  # the intervals run along x
        assert values.min() > low and values.max() <= high
        assert values.min() >= ax.get_xlim()[0]  # inside the axis


def test_hop_gate_shares_are_clipped_to_0_and_1():
    curves = {
        "projecting where it hops": ([1.0, 2.0], [0.95, 0.05], [0.2, 0.2]),
        "projecting elsewhere": ([1.0, 2.0], [0.5, 0.5], [0.1, 0.1]),
        "hops its attention looked at": ([1.0, 2.0], [1.0, 0.9], [0.3, 0.3]),
    }
    fig = hop_gates(
        {"var-chain": (curves, {1.0: [0.9, 1.0], 2.0: [1.0, 1.1]})}, "ddl-transformer", "hops"
    )
    left = fig.axes[0]
    ends = np.concatenate([c.lines[2][0].get_segments() for c in left.containers])[..., 1]
    assert ends.min() >= 0.0 and ends.max() <= 1.0
    assert all(
        "ddl-transformer" in ax.get_title() and "var-chain" in ax.get_title() for ax in fig.axes
    )


def test_a_product_block_has_a_point_per_update_and_ticks_per_sublayer():
    """Two delta updates per sublayer over 2 blocks: 8 probe rows on the 4 sublayers' axis,
    beside a one-update row's 4; the ticks name the sublayers, not the probe rows."""
    curves = {"projecting where it hops": ([1.0], [0.5], [0.1])}
    fig = hop_gates({"var-chain": (curves, {1.0: [1.0] * 8})}, "ddl-product", "hops", 2)
    right = fig.axes[1]
    assert right.lines[0].get_xdata().tolist() == [1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5]
    ticks = [t.get_text() for t in right.get_xticklabels()]
    assert ticks == ["attn 1", "mlp 1", "attn 2", "mlp 2"]
    share = [(0.5, 0.1)]
    panels = {"swap-track": {"ddl-product": (share * 8, 2), "ddl": (share * 4, 1)}}
    (ax,) = query_regimes(panels, "reflection", {"ddl-product": "C0", "ddl": "C1"}).axes
    assert sorted(len(c.lines[0].get_xdata()) for c in ax.containers) == [4, 8]
    assert [t.get_text() for t in ax.get_xticklabels()] == ticks


def test_gate_figures_name_the_model_and_the_task():
    rng = np.random.default_rng(0)
    pooled = {"overwrite": rng.uniform(0.9, 1.1, (64, 4)), "parity": rng.uniform(0, 2, (64, 4))}
    atlas = regime_atlas({t: regime_fractions(b) for t, b in pooled.items()}, "ddl-tied")
    hist = beta_histograms(pooled, "ddl-tied")
    for fig in (atlas, hist):
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert {"overwrite", "parity"} <= {t.split(" on ")[-1] for t in titles}
        assert all("ddl-tied" in t for t in titles)
    det = determinant_plot({t: depth_determinant(b) for t, b in pooled.items()}, "ddl-tied")
    (ax,) = det.axes
    assert "ddl-tied" in ax.get_title()
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["overwrite", "parity"]


def test_the_beta_histogram_colour_scale_shows_a_rare_bin():
    beta = np.r_[np.full(980, 1.0), np.full(20, 2.0 - 1e-3)][:, None]  # 98% project, 2% reflect
    fig = beta_histograms({"parity": beta}, "ddl")
    image = fig.axes[0].get_images()[0]
    assert image.norm(0.98) > 0.95 and image.norm(0.02) > 0.3  # linear would give 0.02


def test_the_probe_check_says_what_it_expects_and_sets_known_deviations_apart():
    expected = np.array([0.0, 0.5, 1.0, 0.5, 0.2])
    measured = np.array([0.0, 0.5, 1.0, 0.6, 0.25])
    relative = np.array([0.5, 0.5, 0.5, 1e-6, 0.5])  # the fourth: little left to erase
    key = np.array([1.0, 1.0, 1.0, 1.0, 5e-5])  # the fifth: a key too short to be unit
    fig = probe_consistency({"parity": (expected, measured, relative, key)})
    title = fig.axes[0].get_title()
    assert "max deviation 0.0e+00" in title and "(2 of 5): 1.0e-01" in title
    text = fig._suptitle.get_text()
    assert "by construction" not in text and "expected on the diagonal" in text
    assert "rounding" in text and "unit vector" in text


def test_phase_portrait_axes_are_named_by_the_task():
    assert dd.make_task("oscillator").state_names == ("q", "p")
    assert dd.make_task("parity").state_names is None
    panel = {"ddl": (np.zeros((1, 4, 2)), np.zeros((1, 4, 2)))}
    named = phase_portraits(panel, "oscillator", 4, ("q", "p")).axes[0]
    plain = phase_portraits(panel, "switched", 4).axes[0]
    assert (named.get_xlabel(), named.get_ylabel()) == ("q", "p")
    assert (plain.get_xlabel(), plain.get_ylabel()) == ("x1", "x2")
    assert "ddl" in named.get_title() and "oscillator" in named.get_title()


@pytest.fixture
def captured(monkeypatch):
    """The figures a figure group draws, by file stem, instead of written files."""
    figures = {}

    def capture(fig, stem):
        figures[Path(stem).name] = fig
        return [Path(f"{stem}.png")]

    monkeypatch.setattr("ddl_dynamics.analysis.figures.save_figure", capture)
    return figures


def test_a_model_keeps_its_colour_in_every_figure_of_a_run(tiny_run, captured):
    make_figures(tiny_run, ("curves", "compare", "trajectories"), progress=False)
    run_colors = {
        m: to_rgb(c) for m, c in row_colors(label for _, label in load_run(tiny_run).rows).items()
    }
    seen = {name: _legend_colors(fig) for name, fig in captured.items() if name != "verdicts"}
    assert {"curves_step", "curves_flops", "nfe", "state_norms"} <= set(seen)
    assert "node" in seen["nfe"] and len(seen["curves_step"]) == 4
    for colors in seen.values():
        for model, color in colors.items():
            assert color == run_colors[model]
    compare = captured["compare"].axes[0]
    for label, bar in zip(compare.get_yticklabels(), compare.containers, strict=True):
        assert to_rgb(bar.lines[0].get_color()) == run_colors[label.get_text()]


def test_trajectories_of_a_run_are_labelled_by_their_task(tiny_run, captured):
    make_figures(tiny_run, ("trajectories",), progress=False)
    for ax in captured["trajectories_oscillator"].axes:
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("q", "p")
        assert ax.get_title().endswith(" on oscillator")


def test_plot_says_why_it_has_nothing_to_draw(tiny_run, capsys):
    assert main(["plot", "hops", str(tiny_run)]) == 1
    err = capsys.readouterr().err
    assert "nothing to draw for hops: no Delta Transformer row" in err and "var-chain" in err
    drawn = make_figures(tiny_run, ("hops", "compare"), progress=False)
    assert drawn and set(drawn.skipped) == {"hops"}
