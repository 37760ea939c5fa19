"""``ddl-dyn``: listings, a user task file end to end, reports, and exit codes."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import ddl_dynamics as dd
from ddl_dynamics.cli import main

TASK_FILE = str(Path(__file__).with_name("custom_tasks.py"))
TOML = """name = "cli"
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 10
n_train = 64
n_test = 32
[[tasks]]
name = "{task}"
[[models]]
name = "resnet"
[[models]]
name = "ddl"
label = "ddl-bmax1"
beta_max = 1.0
"""


@pytest.fixture
def write(tmp_path):
    def write(task="overwrite", text=None, name="exp"):
        path = tmp_path / f"{name}.toml"
        path.write_text(text if text is not None else TOML.format(task=task))
        return str(path)

    return write


def test_listings(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in dd.list_tasks())
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == dd.list_models()
    assert all(len(line.split()) > 1 for line in lines)  # each with its one-line doc


def test_user_task_file_in_worker_pool_with_a_dying_worker(tmp_path):
    """The task file is imported in every worker; a worker's death fails only its cell."""
    exp = tmp_path / "exp.toml"
    exp.write_text(TOML.format(task="tiny-sum") + '[[tasks]]\nname = "worker-crash"\n')
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ddl_dynamics.cli", "run", str(exp), "--jobs", "2",
         "--task-file", TASK_FILE, "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stderr  # some cells failed
    assert "2 ok, 2 failed" in done.stdout and f"report: {run_dir / 'report.md'}" in done.stdout
    report = (run_dir / "report.md").read_text()
    assert "## tiny-sum — mse ↓" in report and "## worker-crash" in report
    assert report.count("**failed** — the worker process died") == 2, report


def test_run_resume_and_report(write, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["run", write(), "--run-dir", str(run_dir), "--seeds", "0,1",
            "--only", "model=ddl-bmax1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 ok" in out and f"report: {run_dir / 'report.md'}" in out
    assert "## overwrite — mse ↓" in (run_dir / "report.md").read_text()
    assert main(argv) == 0 and "0 trained, 2 already done" in capsys.readouterr().out
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in data["tables"][0]["rows"]] == ["ddl-bmax1"]
    csv_path = tmp_path / "r.csv"
    assert main(["report", str(run_dir), "--format", "csv", "--output", str(csv_path)]) == 0
    assert csv_path.read_text().startswith("task,model,")


@pytest.mark.parametrize(("flags", "ensemble"), [([], 2), (["--no-vectorize"], 1)])
def test_seeds_train_together_unless_no_vectorize(flags, ensemble, write, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["run", write(), "--run-dir", str(run_dir), "--seeds", "0,1", "--only",
            "model=resnet", *flags]
    assert main(argv) == 0 and "2 ok" in capsys.readouterr().out
    rows = dd.ResultStore(run_dir / "results.sqlite").rows()
    assert [r.metrics["ensemble"] for r in rows] == [ensemble, ensemble]


def test_diverged_cells_exit_1(write, tmp_path, capsys, infinite_loss):
    infinite_loss(dd.make_task("overwrite"))
    assert main(["run", write(), "--run-dir", str(tmp_path / "r")]) == 1
    assert "2 diverged" in capsys.readouterr().out


BIG_SEED = str(2**63)
#: Experiment files derived from TOML by ``(old, new)`` replacements, for the bad-input test.
VARIANTS = {
    "escape": ('name = "cli"', 'name = "../../escaped"'),
    "absolute": ('name = "cli"', 'name = "/tmp/escaped"'),
    "dup_seeds": ('name = "cli"', 'name = "cli"\nseeds = [0, 1, 0]'),
    "big_seed": ('name = "cli"', f'name = "cli"\nseeds = [{BIG_SEED}]'),
    "negative_seed": ('name = "cli"', 'name = "cli"\nseeds = [-1]'),
    "lr_nan": ("steps = 10", "steps = 10\nlr = nan"),
    "lr_inf": ("steps = 10", "steps = 10\nlr = inf"),
    "beta_inf": ("beta_max = 1.0", "beta_max = inf"),
}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "{missing}"], "no such file"),
        (["run", "{exp}", "--task-file", "{missing}"], "no such file"),
        (["run", "{bad_toml}"], "malformed TOML"),
        (["run", "{bad_model}"], "Did you mean 'ddl'"),
        (["run", "{exp}", "--seeds", "0,x"], "--seeds"),
        (["run", "{exp}", "--only", "modle=ddl"], "--only"),
        (["run", "{exp}", "--address", "auto"], "it needs backend 'ray'"),
        (["report", "{missing}"], "no results store"),
        # broken task files, stores that are not stores, a run folder that is a file
        (["run", "{exp}", "--task-file", "{syntax_py}"], "syntax_error.py: syntax error at line 2"),
        (["run", "{exp}", "--task-file", "{raises_py}"],
         "raises.py: importing it raised RuntimeError: no GPU here"),
        (["run", "{exp}", "--run-dir", "{corrupt}"], "not a results store"),
        (["report", "{corrupt}"], "not a results store"),
        (["plot", "all", "{corrupt}"], "not a results store"),
        (["report", "{unrelated}"], "not a results store"),
        (["plot", "curves", "{unrelated}"], "not a results store"),
        (["run", "{exp}", "--run-dir", "{unrelated}"], "not a results store"),
        (["run", "{exp}", "--run-dir", "{a_file}"], "a file, not a run folder"),
        (["run", "{exp}", "--seeds", BIG_SEED], "0 ≤ seed < 2**63"),
        (["run", "{big_seed}"], "0 ≤ seed < 2**63"),
        # invalid values
        (["run", "{escape}"], "'../../escaped' is not one path component"),
        (["run", "{absolute}"], "'/tmp/escaped' is not one path component"),
        (["run", "{exp}", "--seeds", "-1"], "seed -1 is not an integer 0 ≤ seed"),
        (["run", "{negative_seed}"], "seed -1 is not an integer 0 ≤ seed"),
        (["run", "{dup_seeds}"], "seeds: seed 0 is given twice"),
        (["run", "{exp}", "--seeds", "2,2"], "seed 2 is given twice"),
        (["run", "{lr_nan}"], "defaults.train.lr: expected a finite number, got nan"),
        (["run", "{lr_inf}"], "defaults.train.lr: expected a finite number, got inf"),
        (["run", "{beta_inf}"], "beta_max: expected a finite number, got inf"),
        (["run", "{exp}", "--only", ""], "--only: expected task=LABEL or model=LABEL, got ''"),
        (["run", "{exp}", "--seeds", ""], "--seeds: expected integers like 0,1,2, got ''"),
        (["run", "{binary}"], "binary.toml: not a TOML text file"),
        # tasks that fail check_task stop the run before any cell trains
        (["run", "{wrong_shape}", "--task-file", TASK_FILE],
         "task 'wrong-shape': fails check_task: WrongShape[train]: targets (8, 2) != (8, 1)"),
        (["run", "{nan_targets}", "--task-file", TASK_FILE],
         "task 'nan-targets': fails check_task: NanTargets[train]: targets has NaN/Inf"),
    ],
)
def test_bad_usage_exits_2_with_one_line(argv, message, write, tmp_path, capsys):
    paths = {
        "exp": write(),
        "missing": str(tmp_path / "missing.toml"),
        "bad_toml": str(tmp_path / "bad.toml"),
        "bad_model": str(tmp_path / "bad_model.toml"),
        "syntax_py": str(tmp_path / "syntax_error.py"),
        "raises_py": str(tmp_path / "raises.py"),
        "corrupt": str(tmp_path / "corrupt"),
        "unrelated": str(tmp_path / "unrelated"),
        "a_file": str(tmp_path / "a_file"),
        "binary": str(tmp_path / "binary.toml"),
    }
    Path(paths["bad_toml"]).write_text("[[tasks]\n")
    Path(paths["bad_model"]).write_text(TOML.format(task="parity").replace('"ddl"', '"ddll"'))
    Path(paths["syntax_py"]).write_text("import torch\nx = (\n")
    Path(paths["raises_py"]).write_text('raise RuntimeError("no GPU here")\n')
    for folder in ("corrupt", "unrelated"):
        Path(paths[folder]).mkdir()
    (tmp_path / "corrupt" / "results.sqlite").write_bytes(b"SQLite format 3\0" + b"x" * 4000)
    with sqlite3.connect(tmp_path / "unrelated" / "results.sqlite") as con:
        con.execute("CREATE TABLE photos (path TEXT)")
    Path(paths["a_file"]).write_text("")
    Path(paths["binary"]).write_bytes(bytes(range(256)))
    for name, (old, new) in VARIANTS.items():
        paths[name] = write(text=TOML.format(task="overwrite").replace(old, new), name=name)
    for name in ("wrong_shape", "nan_targets"):
        paths[name] = write(task=name.replace("_", "-"), name=name)
    stores = {p: p.read_bytes() for p in tmp_path.glob("*/results.sqlite")}
    argv = [a.format(**paths) for a in argv]
    if argv[0] == "run" and "--run-dir" not in argv:
        argv += ["--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddl-dyn: error:") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not list(tmp_path.rglob("*.pt"))  # nothing ran
    assert {p: p.read_bytes() for p in stores} == stores  # no store was written into


def test_a_task_that_replaces_a_default_warns_in_one_line(write, tmp_path, capsys):
    """``width = 0`` in [defaults.model] does not apply to 1-D sign-flip, which runs at
    width 1: the run goes on and says so (an error would forbid experiment-wide widths)."""
    text = TOML.format(task="sign-flip").replace("width = 8", "width = 0")
    text = text.replace('name = "sign-flip"', 'name = "sign-flip"\nspec = { variant = "1d" }')
    argv = ["run", write(text=text), "--run-dir", str(tmp_path / "run"), "--only",
            "model=resnet"]
    assert main(argv) == 0
    err = capsys.readouterr().err  # beside the progress bars
    assert [line for line in err.splitlines() if line.startswith("ddl-dyn")] == [
        f"ddl-dyn: warning: {tmp_path / 'exp.toml'}: [defaults.model] width = 0 does not "
        "apply to task 'sign-flip', which sets width = 1"]


def test_report_and_plot_a_task_file_run_from_a_fresh_process(tmp_path):
    """The run folder keeps a copy of the task file, so report and plot need nothing else
    (the original is gone); --task-file is accepted there too."""
    task_file = tmp_path / "my_tasks.py"
    task_file.write_text(Path(TASK_FILE).read_text())
    exp = tmp_path / "exp.toml"
    exp.write_text(TOML.format(task="tiny-sum"))
    run_dir = tmp_path / "run"
    assert main(["run", str(exp), "--task-file", str(task_file), "--run-dir", str(run_dir)]) == 0
    (kept,) = dd.ResultStore(run_dir / "results.sqlite").experiment()["task_files"]
    assert (run_dir / kept["copy"]).read_text() == task_file.read_text()
    assert kept["sha256"][:12] in kept["copy"] and "task:tiny-sum" in kept["registers"]
    task_file.unlink()

    def ddl_dyn(*args):
        return subprocess.run([sys.executable, "-m", "ddl_dynamics.cli", *args],
                              capture_output=True, text=True, timeout=300)

    report = ddl_dyn("report", str(run_dir), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert [t["task"] for t in json.loads(report.stdout)["tables"]] == ["tiny-sum"]
    plot = ddl_dyn("plot", "all", str(run_dir), "--task-file", TASK_FILE)
    assert plot.returncode == 0, plot.stderr
    assert "compare.png" in plot.stdout and "curves_step.png" in plot.stdout


def test_argparse_errors_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    assert main(["run", "x.toml", "--jobs", "many"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_only_keeps_the_commas_of_a_swept_label(tmp_path, capsys):
    experiment = tmp_path / "sweep.toml"
    experiment.write_text('[defaults.model]\nwidth = 8\ndepth = 2\nhidden = 8\n'
                          '[defaults.train]\nsteps = 2\nn_train = 32\nn_test = 16\n'
                          '[[tasks]]\nname = "switched"\n'
                          'spec = { event = ["overwrite", "reflect"], p = [0, 0.5] }\n'
                          '[[models]]\nname = "resnet"\n[[models]]\nname = "ddl"\n')
    run_dir = tmp_path / "run"
    assert main(["run", str(experiment), "--run-dir", str(run_dir),
                 "--only", "task=switched[event=reflect,p=0.5],model=ddl"]) == 0
    rows = dd.ResultStore(run_dir / "results.sqlite").rows()
    assert {(r.task, r.model) for r in rows} == {("switched[event=reflect,p=0.5]", "ddl")}
    capsys.readouterr()
    assert main(["run", str(experiment), "--run-dir", str(run_dir),
                 "--only", "task=switched[p=0.5]"]) == 2
    assert "no task labelled 'switched[p=0.5]'" in capsys.readouterr().err
