"""``ddl-dyn``: listings, a user task file end to end, reports, and exit codes."""

import json
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
    def write(task="overwrite", text=None):
        path = tmp_path / "exp.toml"
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
    assert report.count("**failed** — the worker process died") == 2


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


def test_diverged_cells_exit_1(write, tmp_path, capsys, infinite_loss):
    infinite_loss(dd.make_task("overwrite"))
    assert main(["run", write(), "--run-dir", str(tmp_path / "r")]) == 1
    assert "2 diverged" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "{missing}"], "no such file"),
        (["run", "{exp}", "--task-file", "{missing}"], "no such file"),
        (["run", "{bad_toml}"], "malformed TOML"),
        (["run", "{bad_model}"], "Did you mean 'ddl'"),
        (["run", "{exp}", "--seeds", "0,x"], "--seeds"),
        (["run", "{exp}", "--only", "modle=ddl"], "--only"),
        (["report", "{missing}"], "no results store"),
    ],
)
def test_bad_usage_exits_2_with_one_line(argv, message, write, tmp_path, capsys):
    paths = {
        "exp": write(),
        "missing": str(tmp_path / "missing.toml"),
        "bad_toml": str(tmp_path / "bad.toml"),
        "bad_model": str(tmp_path / "bad_model.toml"),
    }
    Path(paths["bad_toml"]).write_text("[[tasks]\n")
    Path(paths["bad_model"]).write_text(TOML.format(task="parity").replace('"ddl"', '"ddll"'))
    argv = [a.format(**paths) for a in argv] + ["--run-dir", str(tmp_path / "run")] * (
        argv[0] == "run")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddl-dyn: error:") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing ran


def test_argparse_errors_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    assert main(["run", "x.toml", "--jobs", "many"]) == 2
    assert "usage:" in capsys.readouterr().err
