"""The README's quickstart and the custom-task example of the docs work as printed, so they
cannot rot."""

import re
import shlex
from pathlib import Path

import pytest

from ddl_dynamics import RunFolder
from ddl_dynamics.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
TASK_PAGE = (ROOT / "docs" / "adding-a-task.md").read_text()


def block(first_line: str) -> str:
    """The code block of the adding-a-task page that starts with ``first_line``."""
    (body,) = [
        b for _, b in re.findall(r"```(\w+)\n(.*?)```", TASK_PAGE, re.S) if b.startswith(first_line)
    ]
    return body


def test_quickstart_runs_the_suite_and_ci_runs_its_test_command():
    quickstart = next(b for lang, b in BLOCKS if lang == "bash").strip().splitlines()
    assert len(quickstart) == 2
    assert "ddl-dyn run experiments/quick.toml" in quickstart[0]
    assert (ROOT / "experiments" / "quick.toml").is_file()
    ci_commands = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci_commands[-1] == quickstart[1]  # CI ends with the README's test command
    assert any("mkdocs build --strict" in c for c in ci_commands)
    assert shlex.split(quickstart[0])[:3] == ["pip", "install", "torch==2.13.0"]


@pytest.mark.slow  # 8 seeds of 300 steps: over 8 s on 2 cores
def test_custom_task_example_runs_as_printed(tmp_path, monkeypatch):
    (tmp_path / "my_task.py").write_text(block("# my_task.py"))
    (tmp_path / "swap.toml").write_text(block("# swap.toml"))
    command = shlex.split(block("ddl-dyn run swap.toml").strip())
    monkeypatch.chdir(tmp_path)
    assert main(command[1:]) == 0
    rows = RunFolder.open(tmp_path / "runs" / "swap").store.rows()
    assert {r.model for r in rows} == {"resnet", "ddl"} and {r.status for r in rows} == {"ok"}
    # A swap is learnable: both stacks beat predicting zero (MSE 2 on standard normals).
    assert all(r.metrics["test"] < 0.5 for r in rows)
