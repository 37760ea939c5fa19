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
from matplotlib.colors import to_rgb

import ddl_dynamics as dd
from ddl_dynamics.analysis import plots
from ddl_dynamics.analysis.figures import FIGURE_KINDS
from ddl_dynamics.analysis.probes import probe_model
from ddl_dynamics.analysis.regimes import contraction, depth_determinant, regime_fractions
from ddl_dynamics.analysis.report import render
from ddl_dynamics.cli import main
from ddl_dynamics.models.operator import gate_logit

PLANTED = (2.0, 1.0, 0.0, 1.5)  # reflection, projection, identity, over-relaxed


def planted_ddl(task):
    """A DDL stack whose gate on layer i is PLANTED[i] for every sample."""
    model = dd.make_model("ddl", in_dim=task.in_dim, out_dim=task.out_dim,
                          control_dim=task.control_dim, width=8, depth=len(PLANTED))
    with torch.no_grad():
        for i, beta in enumerate(PLANTED):
            out = model.layer(i).branch.out
            out.weight[model.d].zero_()
            # β = 2σ(logit); ±30 saturates the sigmoid to within 1e-13 of 0 or 2
            out.bias[model.d] = 30.0 if beta == 2.0 else -30.0 if beta == 0.0 else (
                gate_logit(beta))
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
    model = dd.make_model("ddl", in_dim=task.in_dim, out_dim=task.out_dim,
                          control_dim=task.control_dim, width=8, depth=4)
    cfg = dd.TrainConfig(steps=40, batch_size=64, n_train=256, n_test=128, eval_every=40)
    assert dd.train(task, model, cfg, seed=0).status == "ok"
    arrays = probe_model(task, model.eval(), seed=0, n=128)
    measured = contraction(arrays["e_pre"], arrays["e_post"])
    expected = np.abs(1 - arrays["beta"])
    ok = np.isfinite(measured)
    assert ok.mean() > 0.9
    np.testing.assert_allclose(measured[ok], expected[ok], atol=1e-4)
    # The write-only control has no such contraction: its readout keeps the old value.
    write = dd.make_model("ddl-write", in_dim=task.in_dim, out_dim=task.out_dim,
                          control_dim=task.control_dim, width=8, depth=4)
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


@pytest.mark.parametrize("kind", [k for k in FIGURE_KINDS if k != "hops"])  # test_hops.py
def test_every_plot_command_writes_images(tiny_run, kind, capsys):
    assert main(["plot", kind, str(tiny_run)]) == 0
    written = capsys.readouterr().out.split()
    assert written and any(p.endswith(".png") for p in written)
    for path in written:
        data = Path(path).read_bytes()
        assert len(data) > 1000
        assert data.startswith(b"\x89PNG") if path.endswith(".png") else b"<svg" in data[:2000]


def test_probes_are_cached_and_plotting_never_retrains(tiny_run):
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
    cells = {"overwrite": {"ddl": ("win", "-0.4 ± 0.1"), "ddl-write": ("loss", "+0.2 ± 0.1"),
                           "gated": ("equivalent", "+0.01 ± 0.01")},
             "parity": {"ddl": ("inconclusive", "+0.01 ± 0.3"),
                        "node": ("unequal budget", "no test"),
                        "gated": ("unmatched size", "no test"),
                        "ddl-lin": ("both solved", "+0 ± 0"), "ddl-write": ("fails", "—")}}
    fig = plots.verdict_matrix(cells)
    ax = fig.axes[0]
    drawn = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches}
    expected = {tuple(round(c, 3) for c in to_rgb(color)) for color in plots.MARK_COLORS.values()}
    assert drawn == expected and len(ax.patches) == 8  # (overwrite, node) stays blank
    texts = {t.get_text() for t in ax.texts}
    assert "win\n-0.4 ± 0.1" in texts and "unequal budget\nno test" in texts
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 2  # no test drawn
    assert [t.get_text() for t in ax.get_yticklabels()] == ["overwrite", "parity"]


def test_html_report_is_self_contained(tiny_run):
    assert main(["report", str(tiny_run), "--format", "html"]) == 0
    page = (tiny_run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') >= 8
    assert "http://" not in page and "https://" not in page
    for section in ("Expectations", "Gate regimes", "oscillator", "parity", "torch"):
        assert section in page
    # A summary with the verdict matrix opens the report, the verdict table comes next.
    order = [page.index(s) for s in ('<h2 id="summary">', 'alt="verdicts"', '<h2 id="verdicts">',
                                     '<h2 id="expectations', '<h2 id="crossover">',
                                     'alt="crossover_switched"', '<h2 id="results-per-task">',
                                     '<h2 id="figures">')]
    assert order == sorted(order) and page.count('alt="verdicts"') == 1
    assert page.count('alt="crossover_switched"') == 1 and "none in range" in page
    assert (tiny_run / "figures" / "verdicts.png").is_file()
    assert "probe_consistency" in page and "not evidence about training" in page


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium)")
def test_html_report_renders_in_headless_chromium(tiny_run, tmp_path):
    page = tiny_run / "report.html"
    if not page.exists():
        assert main(["report", str(tiny_run), "--format", "html"]) == 0
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<img") == page.read_text().count("<img")
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", "--window-size=1200,2000",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
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
    for stem in ("regime_atlas_ddl-b0.5", "regime_atlas_ddl-b0.25",
                 "trajectories_oscillator[horizon=1.5]",
                 "trajectories_oscillator[horizon=1.25]"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    assert len(names) == len(written) == len(list((dotted_run / "figures").iterdir()))


def test_a_probe_cut_short_counts_as_missing(dotted_run, capsys):
    """A probe file written only in part (by a process killed mid-write before files were
    renamed into place) or damaged is probed again, and read by nothing meanwhile."""
    assert main(["plot", "regimes", str(dotted_run)]) == 0
    cut, empty, *_ = sorted((dotted_run / "probes").glob("*.npz"))
    cut.write_bytes(cut.read_bytes()[:200])
    empty.write_bytes(b"")
    assert main(["report", str(dotted_run)]) == 0  # reads the cache, probes nothing
    assert cut.stat().st_size == 200 and "ddl-b0.5" in capsys.readouterr().out
    assert main(["plot", "regimes", str(dotted_run)]) == 0
    for path in (cut, empty):
        with np.load(path) as arrays:
            assert arrays["beta"].shape[1] == 3  # every layer's gate, again


def test_a_plot_killed_while_probing_leaves_a_run_the_html_report_takes(dotted_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(dotted_run, run, ignore=shutil.ignore_patterns("probes", "figures"))
    plot = subprocess.Popen([sys.executable, "-m", "ddl_dynamics.cli", "plot", "regimes",
                             str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probes = run / "probes"
    while plot.poll() is None and not (probes.is_dir() and any(probes.iterdir())):
        time.sleep(0.001)
    plot.kill()  # as the first probe is being written
    assert plot.wait() == -signal.SIGKILL
    for path in probes.glob("*.npz"):  # whole, or not there
        with np.load(path) as arrays:
            assert "beta" in arrays
    report = subprocess.run([sys.executable, "-m", "ddl_dynamics.cli", "report", str(run),
                             "--format", "html"], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert (run / "report.html").read_text().count('alt="regime_atlas_ddl-b0.') == 2
    assert len(list(probes.glob("*.npz"))) == 4
