"""A run folder keeps the task files it ran (``task_files/``), and reading the folder imports
them: Python from the folder runs. ``report --no-task-files`` reads it importing nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddl_dynamics.cli import main

TASK = '''
from dataclasses import dataclass
from pathlib import Path

import torch

from ddl_dynamics import Task, TaskData, register_task, split_generator

Path({mark!r}).write_text("imported")


@register_task("trust-sum")
@dataclass(frozen=True)
class TrustSum(Task):
    """The sum of two inputs."""

    @property
    def in_dim(self) -> int:
        return 2

    @property
    def out_dim(self) -> int:
        return 1

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        self.check_split(split)
        x = torch.randn(n, 2, generator=split_generator(seed, split))
        return TaskData(x, x.sum(-1, keepdim=True), 2)
'''
EXPERIMENT = """seeds = [0]
[defaults.model]
width = 4
depth = 2
[defaults.train]
steps = 2
eval_every = 2
n_train = 16
n_test = 8
[[tasks]]
name = "{task}"
[[models]]
name = "resnet"
"""


def report(run: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddl_dynamics.cli", "report", str(run), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_report_without_task_files_imports_nothing_from_the_folder(tmp_path):
    mark = tmp_path / "imported"
    task_file = tmp_path / "trust_task.py"
    task_file.write_text(TASK.format(mark=str(mark)))
    (tmp_path / "exp.toml").write_text(EXPERIMENT.format(task="trust-sum"))
    run = tmp_path / "run"
    assert (
        main(
            [
                "run",
                str(tmp_path / "exp.toml"),
                "--run-dir",
                str(run),
                "--task-file",
                str(task_file),
            ]
        )
        == 0
    )
    mark.unlink()
    task_file.unlink()  # the folder's copy is what a reader would import
    refused = report(run, "--no-task-files")
    assert refused.returncode == 2 and not mark.exists(), refused.stderr
    assert "trust-sum" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert report(run).returncode == 0 and mark.read_text() == "imported"


def test_report_without_task_files_reads_a_folder_of_built_in_tasks(tmp_path, capsys):
    (tmp_path / "exp.toml").write_text(EXPERIMENT.format(task="overwrite"))
    run = tmp_path / "run"
    assert main(["run", str(tmp_path / "exp.toml"), "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--no-task-files", "--format", "json"]) == 0
    assert '"task": "overwrite"' in capsys.readouterr().out
