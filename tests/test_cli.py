"""``ddl-dyn``: listings, a user task file end to end, reports, and exit codes."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    # each with its docstring's whole first paragraph, never cut mid-sentence
    described = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines}
    assert all(text.endswith((".", ")")) for text in described.values()), described
    assert (
        "with value_channels > 1, the additive expanded-state control" in described["transformer"]
    )
    assert "dopri5" in described["node"] and "solved by torchdiffeq" not in described["node"]


def test_one_task_or_model_lists_its_options_with_defaults_and_docs(capsys):
    assert main(["tasks", "var-chain"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for field, default in (
        ("hops", "2"),
        ("chains", "2"),
        ("reassign", "False"),
        ("negate", "False"),
    ):
        assert f" = {default}  " in lines[field], lines[field]
    assert "look-ups a query takes" in lines["hops"]
    assert main(["tasks", "tiny-sum", "--task-file", TASK_FILE]) == 0
    assert "  dim (int) = 2" in capsys.readouterr().out
    assert main(["models", "node"]) == 0
    out = capsys.readouterr().out
    assert "  max_steps (int) = 1000  solver steps between two consecutive depth steps" in out
    assert main(["tasks", "var-chian"]) == 2
    assert "Did you mean 'var-chain'?" in capsys.readouterr().err


def test_version_and_help_import_no_heavy_module():
    """``--help`` answers at once: it imports neither torch nor matplotlib."""
    code = (
        "import sys\nfrom ddl_dynamics.cli import main\n"
        "for argv in (['--version'], ['--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ddl-dyn {dd.__version__}\n")
    assert "COMMAND" in done.stdout and done.stdout.rstrip().endswith("[]")


def test_subcommand_help_says_the_defaults_and_every_plot_kind(capsys):
    from ddl_dynamics.analysis.figures import FIGURE_KINDS

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 1: in this process" in text and "ray: the cells as Ray tasks" in text
    assert main(["plot", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = {line.split()[0]: line for line in lines[lines.index("figure kinds:") + 1 :]}
    assert list(kinds) == [*FIGURE_KINDS, "all"]
    assert all(len(line.split()) > 3 for line in kinds.values())


def test_internal_errors_are_not_reported_as_bad_usage(monkeypatch, capsys):
    """A bug (any exception the suite did not raise about its input, a ValueError from inside
    a library included) exits 3 and says where its traceback is; bad usage stays exit 2."""
    import numpy as np

    from ddl_dynamics import cli

    def buggy(args):
        return {}["missing"]

    def library_error(args):
        return np.zeros(2).reshape(3)

    def unpacking(args):  # a ValueError of a built-in operation, not of a raise
        first, _ = args.name or (1, 2, 3)
        return first

    def in_a_raise(args):  # the raise line's own message fails to format: still a bug
        raise ValueError(f"{'three':d} seeds")

    for fake, kind in (
        (buggy, "KeyError"),
        (library_error, "ValueError"),
        (unpacking, "ValueError"),
        (in_a_raise, "ValueError"),
    ):
        monkeypatch.setattr(cli, "_tasks", fake)
        assert main(["tasks"]) == 3
        err = capsys.readouterr().err
        assert err.startswith(f"ddl-dyn: internal error (a bug, not your input): {kind}: ")
        assert len(err.strip().splitlines()) == 1
        saved = Path(err.strip().rpartition("traceback in ")[2])
        assert kind in saved.read_text() and "Traceback" in saved.read_text()
        saved.unlink()


def test_bad_usage_is_decided_by_the_errors_type(monkeypatch, capsys):
    """The suite's typed errors (a config's, a task's, a cap the config set) and a
    ValueError that a raise statement of the suite or a task file states exit 2."""
    from ddl_dynamics import cli
    from ddl_dynamics._task_check import TaskCheckError
    from ddl_dynamics.experiment.caps import SolverCap
    from ddl_dynamics.experiment.config import ConfigError

    def raising(error):
        def command(args):
            raise error

        return command

    for error in (
        ConfigError("exp.toml", "train.steps", "must be positive"),
        TaskCheckError("tiny: inputs are float64"),
        SolverCap("solver cap: max_num_steps exceeded"),
        ValueError("a task file's own check"),
        FileNotFoundError("no such file: x"),
    ):
        monkeypatch.setattr(cli, "_tasks", raising(error))
        assert main(["tasks"]) == 2, error
        assert capsys.readouterr().err == f"ddl-dyn: error: {error}\n"


@pytest.mark.slow  # a worker pool that loses a worker
def test_user_task_file_in_worker_pool_with_a_dying_worker(tmp_path):
    """The task file is imported in every worker; a worker's death fails only its cell."""
    exp = tmp_path / "exp.toml"
    exp.write_text(TOML.format(task="tiny-sum") + '[[tasks]]\nname = "worker-crash"\n')
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddl_dynamics.cli",
            "run",
            str(exp),
            "--jobs",
            "2",
            "--task-file",
            TASK_FILE,
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # some cells failed
    assert "2 ok, 2 failed" in done.stdout and f"report: {run_dir / 'report.md'}" in done.stdout
    report = (run_dir / "report.md").read_text()
    assert "## tiny-sum (mse ↓)" in report and "## worker-crash" in report
    assert report.count("**failed** — the worker process died") == 2, report
    assert "leaked semaphore" not in done.stderr  # the resource tracker's, about the dead worker


def test_run_resume_and_report(write, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [
        "run",
        write(),
        "--run-dir",
        str(run_dir),
        "--seeds",
        "0,1",
        "--only",
        "model=ddl-bmax1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 ok" in out and f"report: {run_dir / 'report.md'}" in out
    assert "compiled: 0 groups, 0.0 s compiling" in out  # a short cell stays eager on "auto"
    assert "## overwrite (mse ↓)" in (run_dir / "report.md").read_text()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0 trained, 2 already done" in out and "compiled:" not in out
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in data["tables"][0]["rows"]] == ["ddl-bmax1"]
    csv_path = tmp_path / "r.csv"
    assert main(["report", str(run_dir), "--format", "csv", "--output", str(csv_path)]) == 0
    lines = csv_path.read_text().splitlines()  # one line per cell, under a header
    assert lines[0].startswith("task,model,seed,") and len(lines) == 3
    assert [line.split(",")[:3] for line in lines[1:]] == [
        ["overwrite", "ddl-bmax1", "0"],
        ["overwrite", "ddl-bmax1", "1"],
    ]


@pytest.mark.parametrize(("flags", "ensemble"), [([], 2), (["--no-vectorize"], 1)])
def test_seeds_train_together_unless_no_vectorize(flags, ensemble, write, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [
        "run",
        write(),
        "--run-dir",
        str(run_dir),
        "--seeds",
        "0,1",
        "--only",
        "model=resnet",
        *flags,
    ]
    assert main(argv) == 0 and "2 ok" in capsys.readouterr().out
    rows = dd.RunFolder.open(run_dir, "w").store.rows()
    assert [r.metrics["ensemble"] for r in rows] == [ensemble, ensemble]
    assert [r.metrics["vectorize"] for r in rows] == [not flags] * 2  # the keys do not say it


def test_a_rerun_beside_other_results_warns_in_one_line(write, tmp_path, capsys):
    """Results of an edited file, or of another experiment, go beside the stored ones: the
    run says so; the store records what each run selected and how far it got."""
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), "--only", "model=resnet", "--seeds", "1"]
    assert main(["run", write(), *argv]) == 0
    store = dd.RunFolder.open(run_dir, "w").store
    assert store.progress() == dd.experiment.provenance.Progress(1, 1, ended=True)
    assert main(["run", write(), *argv, "--seeds", "0,1"]) == 0  # more cells: nothing to say
    edited = write(text=TOML.format(task="overwrite").replace("steps = 10", "steps = 12"))
    assert main(["run", edited, *argv]) == 0
    other = write(
        text=TOML.format(task="overwrite").replace('name = "cli"', 'name = "other"'), name="other"
    )
    assert main(["run", other, *argv]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ddl-dyn")]
    assert warned == [
        f"ddl-dyn: warning: {run_dir}: 1 of the selected cells have results under another "
        "config (e.g. overwrite × resnet, seed 0: train.steps 10 → 12); the new results are "
        "stored beside them",
        f"ddl-dyn: warning: {run_dir} holds results of experiment 'cli': those of 'other' are "
        "stored beside them",
    ]
    assert str(store.progress()) == "1 of 1 cells"


@pytest.mark.slow  # over 10 s on 2 cores
def test_storage_problems_are_named_and_read_only_runs_are_reported(tmp_path, as_user, write):
    """A run folder on read-only storage is reported (md, and html written elsewhere) and
    never written; a run into it, or an unreadable store, says what is wrong in one line."""
    read_only, unreadable = tmp_path / "read-only", tmp_path / "unreadable"
    for folder in (read_only, unreadable):
        folder.mkdir()
        plant(folder)
    (unreadable / "results.sqlite").chmod(0)
    before = {p: p.is_file() and p.read_bytes() for p in read_only.rglob("*")}
    for path in (read_only, *read_only.rglob("*")):
        path.chmod(0o555 if path.is_dir() else 0o444)
    html = tmp_path / "report.html"
    try:
        md, page, plot, rerun, denied = as_user(
            ["report", str(read_only)],
            ["report", str(read_only), "--format", "html", "--output", str(html)],
            ["plot", "all", str(read_only)],
            ["run", write(), "--run-dir", str(read_only)],
            ["report", str(unreadable)],
        )
    finally:
        for path in (read_only, *read_only.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert md[0] == 0 and "## overwrite (mse ↓)" in md[1], md
    assert page[0] == 0 and html.read_text().count("<img") >= 1, page
    assert plot[0] == 2 and plot[2].endswith(
        f"ddl-dyn: error: cannot write figures into "
        f"{read_only / 'figures'}: read-only or no "
        "permission\n"
    ), plot
    assert rerun[0] == 2 and f"error: read-only: {read_only / 'results.sqlite'}" in rerun[2]
    assert denied[0] == 2 and "error: permission denied: " in denied[2], denied
    assert {p: p.is_file() and p.read_bytes() for p in read_only.rglob("*")} == before


def test_a_full_disk_is_named(write, tmp_path, capsys, monkeypatch):
    """SQLite says a full disk as it says any file it cannot grow: so do its connections
    here, capped at the pages the store has when first opened."""
    connect = sqlite3.connect

    def capped(*args, **kwargs):
        con = connect(*args, **kwargs)
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.execute(f"PRAGMA max_page_count = {max(pages, 1)}")
        return con

    monkeypatch.setattr(sqlite3, "connect", capped)
    assert main(["run", write(), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.rpartition("\r")[2]
    assert err.startswith(
        f"ddl-dyn: error: disk full: {tmp_path / 'run' / 'results.sqlite'} "
        "(database or disk is full)"
    ), err


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
    # labels name figure files: one path component, not too long, printable
    "label_escape": ('label = "ddl-bmax1"', 'label = "../../../../x/ESCAPED"'),
    "label_nested": ('label = "ddl-bmax1"', 'label = "ddl/v2"'),
    "label_backslash": ('label = "ddl-bmax1"', 'label = "ddl\\\\v2"'),
    "label_dotdot": ('label = "ddl-bmax1"', 'label = ".."'),
    "label_empty": ('label = "ddl-bmax1"', 'label = ""'),
    "label_long": ('label = "ddl-bmax1"', f'label = "{"d" * 300}"'),
    "label_newline": ('label = "ddl-bmax1"', 'label = "ddl\\nbmax1"'),
    "task_label": ('name = "overwrite"', 'name = "overwrite"\nlabel = "../x"'),
    "name_long": ('name = "cli"', f'name = "{"n" * 300}"'),
    "baseline_circle": (
        'name = "resnet"\n[[models]]\nname = "ddl"\n',
        'name = "resnet"\nbaseline = "ddl-bmax1"\n[[models]]\nname = "ddl"\nbaseline = "resnet"\n',
    ),
    "device": ("steps = 10", 'steps = 10\ndevice = "cpu:abc"'),
    "nested": (
        'name = "overwrite"',
        f'name = "overwrite"\nspec = {{ depth = {"[" * 40}3{"]" * 40} }}',
    ),
    # sizes and budgets beyond any sane run
    "hidden_huge": ("hidden = 8", "hidden = 10000000000000"),
    "match_huge": ("hidden = 8", "match_params = 1000000000000"),
    "width_huge": ("width = 8", "width = 10000000"),
    "depth_huge": ("depth = 3", "depth = 1000000"),
    "steps_huge": ("steps = 10", "steps = 1000000000000"),
    "n_train_huge": ("n_train = 64", "n_train = 1000000000"),
}
LIMIT = "is beyond any sane run"


def plant(folder, label="ddl", weights=True):
    """A run folder with one finished ``ddl`` cell, untrained (real weights, nothing
    trained), its row stored under ``label``."""
    cfg = dd.parse_experiment(
        {
            "tasks": [{"name": "overwrite"}],
            "models": [{"name": "ddl"}],
            "defaults": {"model": {"width": 8, "depth": 3, "hidden": 8}},
        }
    )
    cell = dd.expand_cells(cfg)[0]
    run = dd.RunFolder.open(folder, "w")
    store = run.store
    store.put(
        dd.RunResult(
            status="ok",
            key=cell.key,
            task=cell.task_label,
            model=label,
            seed=0,
            metrics={"metric": "mse", "test": 0.5},
            curve=[[1, 0.5, 0.5, 1.0]],
            config=cell.to_dict(),
        )
    )
    if weights:
        run.model_path(cell.key).parent.mkdir()
        torch.save(cell.build()[1].state_dict(), run.model_path(cell.key))
    return store


#: Run folders damaged after the fact, by what :func:`plant` leaves changed.
DAMAGED = {
    "bad_metrics": lambda folder: _update(plant(folder), "metrics = '[]'"),
    "bad_curve": lambda folder: _update(plant(folder), "curve = '[[1, 0.5'"),
    "bad_label": lambda folder: plant(folder, label="../../../../x/ESCAPED"),
    "bad_weights": lambda folder: [
        p.write_bytes(p.read_bytes()[:500])
        for p in (plant(folder).path.parent / "models").iterdir()
    ],
    "foreign_weights": lambda folder: [
        p.write_bytes(b"not weights") for p in (plant(folder).path.parent / "models").iterdir()
    ],
}


def _update(store, change):
    with sqlite3.connect(store.path) as con:
        con.execute(f"UPDATE results SET {change}")


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
        (["report", "{missing}"], "no such run folder"),
        # broken task files, stores that are not stores, a run folder that is a file
        (["run", "{exp}", "--task-file", "{syntax_py}"], "syntax_error.py: syntax error at line 2"),
        (
            ["run", "{exp}", "--task-file", "{raises_py}"],
            "raises.py: importing it raised RuntimeError: no GPU here",
        ),
        (["run", "{exp}", "--run-dir", "{corrupt}"], "not a results store"),
        (["report", "{corrupt}"], "not a results store"),
        (["plot", "all", "{corrupt}"], "not a results store"),
        (["report", "{unrelated}"], "not a results store"),
        (["plot", "curves", "{unrelated}"], "not a results store"),
        (["run", "{exp}", "--run-dir", "{unrelated}"], "not a results store"),
        (["run", "{exp}", "--run-dir", "{a_file}"], "a file, not a run folder"),
        (["run", "{exp}", "--seeds", f"0,{BIG_SEED}"], "0 ≤ seed < 2**63"),
        (["run", "{exp}", "--seeds", BIG_SEED], "seeds is beyond any sane run"),
        (["run", "{big_seed}"], "0 ≤ seed < 2**63"),
        # invalid values
        (["run", "{escape}"], "'../../escaped' is not one path component"),
        (["run", "{absolute}"], "'/tmp/escaped' is not one path component"),
        (["run", "{exp}", "--seeds", "0,-1"], "seed -1 is not an integer 0 ≤ seed"),
        (["run", "{exp}", "--seeds", "0"], "--seeds: a count is at least 1"),
        (["run", "{negative_seed}"], "seed -1 is not an integer 0 ≤ seed"),
        (["run", "{dup_seeds}"], "seeds: seed 0 is given twice"),
        (["run", "{exp}", "--seeds", "2,2"], "seed 2 is given twice"),
        (["run", "{lr_nan}"], "defaults.train.lr: expected a finite number, got nan"),
        (["run", "{lr_inf}"], "defaults.train.lr: expected a finite number, got inf"),
        (["run", "{beta_inf}"], "beta_max: expected a finite number, got inf"),
        (["run", "{exp}", "--only", ""], "--only: expected task=LABEL or model=LABEL, got ''"),
        (
            ["run", "{exp}", "--seeds", ""],
            "--seeds: expected a count like 3 or seeds like 0,1,2, got ''",
        ),
        (["run", "{binary}"], "binary.toml: not a TOML text file"),
        # tasks that fail check_task stop the run before any cell trains
        (
            ["run", "{wrong_shape}", "--task-file", TASK_FILE],
            "task 'wrong-shape': fails check_task: WrongShape[train]: targets (8, 2) != (8, 1)",
        ),
        (
            ["run", "{nan_targets}", "--task-file", TASK_FILE],
            "task 'nan-targets': fails check_task: NanTargets[train]: targets has NaN/Inf",
        ),
        (
            ["run", "{float64_inputs}", "--task-file", TASK_FILE],
            "fails check_task: Float64Inputs[train]: inputs must be float32, got torch.float64",
        ),
        # task files that end the process or interrupt it as they are imported
        (
            ["run", "{exp}", "--task-file", "{exits_py}"],
            "exits.py: importing it raised SystemExit: 0",
        ),
        (
            ["run", "{exp}", "--task-file", "{interrupts_py}"],
            "interrupts.py: importing it raised KeyboardInterrupt",
        ),
        # labels and names that would escape the run folder, collide or not fit a file name
        (["run", "{label_escape}"], "models[1].label: '../../../../x/ESCAPED' is not one path"),
        (["run", "{label_nested}"], "models[1].label: 'ddl/v2' is not one path component"),
        (["run", "{label_backslash}"], "models[1].label: 'ddl\\\\v2' is not one path component"),
        (["run", "{label_dotdot}"], "models[1].label: '..' is not one path component"),
        (["run", "{label_empty}"], "models[1].label: '' is not one path component"),
        (["run", "{label_long}"], "models[1].label: 'dddddddddddddddddddddddd'… is 300 bytes long"),
        (["run", "{label_newline}"], "models[1].label: 'ddl\\nbmax1' has a control character"),
        (["run", "{task_label}"], "tasks[0].label: '../x' is not one path component"),
        (["run", "{name_long}"], "name: 'nnnnnnnnnnnnnnnnnnnnnnnn'… is 300 bytes long, over 200"),
        (
            ["run", "{baseline_circle}"],
            "baselines name each other in a circle: resnet → ddl-bmax1 → resnet",
        ),
        (["run", "{exp}", "--run-dir", ""], "run_dir: an empty path"),
        (["report", ""], "run_dir: an empty path"),
        (["report", "{exp}", "--output", ""], "output: an empty path"),
        # values every cell would fail on, or that would hang, caught at load time
        (["run", "{device}"], "device must be 'cpu', 'cuda' or 'cuda:<index>', got 'cpu:abc'"),
        (["run", "{hidden_huge}"], f"hidden = 10000000000000 {LIMIT}"),
        (
            ["run", "{match_huge}"],
            f"match_params = 1000000000000: 1,000,000,000,000 parameters {LIMIT}",
        ),
        (
            ["run", "{width_huge}"],
            f"width = 10000000 {LIMIT} (at most 100,000); set "
            "DDL_DYNAMICS_NO_LIMITS=1 if you mean it",
        ),
        (["run", "{depth_huge}"], f"depth = 1000000 {LIMIT}"),
        (["run", "{steps_huge}"], f"steps = 1000000000000 {LIMIT}"),
        (["run", "{n_train_huge}"], f"n_train = 1000000000 {LIMIT}"),
        (
            ["run", "{exp}", "--jobs", "99999999999999999999"],
            "jobs must be between 1 and 1024, got 99999999999999999999",
        ),
        (["run", "{exp}", "--jobs", "0"], "jobs must be between 1 and 1024, got 0"),
        (["bench", "--repeats", "0"], "--repeats: expected at least 1 timed repeat, got 0"),
        # files TOML cannot read, explained
        (["run", "{deep_toml}"], "deep.toml: nested more than 32 tables or lists deep"),
        (["run", "{nested}"], "tasks[0].spec.depth[0][0][0]"),
        (["run", "{bom}"], "bom.toml: starts with a UTF-8 byte-order mark"),
        # stores and weights damaged after the run: the cell is named
        (["report", "{bad_metrics}"], "damaged row in {bad_metrics}/results.sqlite: cell "),
        (
            ["report", "{bad_metrics}"],
            "'overwrite' × 'ddl', seed 0): its metrics is not a JSON object",
        ),
        (["plot", "curves", "{bad_curve}"], "its curve is not JSON (Expecting"),
        (
            ["plot", "all", "{bad_label}"],
            "× '../../../../x/ESCAPED', seed 0): '../../../../x/ESCAPED' is not one path",
        ),
        (["plot", "regimes", "{bad_weights}"], "damaged weights: {bad_weights}/models/"),
        (
            ["report", "{bad_weights}", "--format", "html", "--output", "{exp}.html"],
            "'overwrite' × 'ddl', seed 0), cannot be read (RuntimeError: PytorchStreamReader",
        ),
        (["plot", "trajectories", "{foreign_weights}"], "damaged weights: {foreign_weights}/"),
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
    for name, text in (
        ("exits", "import sys\nsys.exit(0)\n"),
        ("interrupts", "raise KeyboardInterrupt\n"),
    ):
        paths[f"{name}_py"] = str(tmp_path / f"{name}.py")
        Path(paths[f"{name}_py"]).write_text(text)
    for name, (old, new) in VARIANTS.items():
        assert old in TOML.format(task="overwrite"), name
        paths[name] = write(text=TOML.format(task="overwrite").replace(old, new), name=name)
    for name in ("wrong_shape", "nan_targets", "float64_inputs"):
        paths[name] = write(task=name.replace("_", "-"), name=name)
    paths["deep_toml"] = write(text=f"x = {'[' * 1000}{']' * 1000}\n", name="deep")
    paths["bom"] = write(text="\ufeff" + TOML.format(task="overwrite"), name="bom")
    for name, damage in DAMAGED.items():
        paths[name] = str(tmp_path / name)
        if f"{{{name}}}" in " ".join(argv):
            (tmp_path / name).mkdir()
            damage(tmp_path / name)
    stores = {p: p.read_bytes() for p in tmp_path.glob("*/results.sqlite")}
    weights = set(tmp_path.rglob("*.pt"))
    argv = [a.format(**paths) for a in argv]
    if argv[0] == "run" and "--run-dir" not in argv:
        argv += ["--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.rpartition("\r")[2]  # after any progress bar
    assert err.startswith("ddl-dyn: error:") and message.format(**paths) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists() and set(tmp_path.rglob("*.pt")) == weights  # no run
    assert {p: p.read_bytes() for p in stores} == stores  # no store was written into
    assert not list(tmp_path.rglob("*ESCAPED*")) and not (tmp_path / "x").exists()


def test_a_task_that_replaces_a_default_warns_in_one_line(write, tmp_path, capsys):
    """``width = 0`` in [defaults.model] does not apply to 1-D sign-flip, which runs at
    width 1: the run goes on and says so (an error would forbid experiment-wide widths)."""
    text = TOML.format(task="sign-flip").replace("width = 8", "width = 0")
    text = text.replace('name = "sign-flip"', 'name = "sign-flip"\nspec = { variant = "1d" }')
    argv = ["run", write(text=text), "--run-dir", str(tmp_path / "run"), "--only", "model=resnet"]
    assert main(argv) == 0
    err = capsys.readouterr().err  # beside the progress bars
    assert [line for line in err.splitlines() if line.startswith("ddl-dyn")] == [
        f"ddl-dyn: warning: {tmp_path / 'exp.toml'}: [defaults.model] width = 0 does not "
        "apply to task 'sign-flip', which sets width = 1"
    ]


@pytest.mark.slow  # over 10 s on 2 cores
def test_report_and_plot_a_task_file_run_from_a_fresh_process(tmp_path):
    """The run folder keeps a copy of the task file, so report and plot need nothing else
    (the original is gone); --task-file is accepted there too."""
    task_file = tmp_path / "my_tasks.py"
    task_file.write_text(Path(TASK_FILE).read_text())
    exp = tmp_path / "exp.toml"
    exp.write_text(TOML.format(task="tiny-sum"))
    run_dir = tmp_path / "run"
    assert main(["run", str(exp), "--task-file", str(task_file), "--run-dir", str(run_dir)]) == 0
    (kept,) = dd.RunFolder.open(run_dir, "w").store.experiment()["task_files"]
    assert (run_dir / kept["copy"]).read_text() == task_file.read_text()
    assert kept["sha256"][:12] in kept["copy"] and "task:tiny-sum" in kept["registers"]
    task_file.unlink()

    def ddl_dyn(*args):
        return subprocess.run(
            [sys.executable, "-m", "ddl_dynamics.cli", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )

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
    experiment.write_text(
        "[defaults.model]\nwidth = 8\ndepth = 2\nhidden = 8\n"
        "[defaults.train]\nsteps = 2\nn_train = 32\nn_test = 16\n"
        '[[tasks]]\nname = "switched"\n'
        'spec = { event = ["overwrite", "reflect"], p = [0, 0.5] }\n'
        '[[models]]\nname = "resnet"\n[[models]]\nname = "ddl"\n'
    )
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "run",
                str(experiment),
                "--run-dir",
                str(run_dir),
                "--only",
                "task=switched[event=reflect,p=0.5],model=ddl",
            ]
        )
        == 0
    )
    rows = dd.RunFolder.open(run_dir, "w").store.rows()
    assert {(r.task, r.model) for r in rows} == {("switched[event=reflect,p=0.5]", "ddl")}
    capsys.readouterr()
    assert (
        main(["run", str(experiment), "--run-dir", str(run_dir), "--only", "task=switched[p=0.5]"])
        == 2
    )
    assert "no task labelled 'switched[p=0.5]'" in capsys.readouterr().err
