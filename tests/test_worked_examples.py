"""The docs' worked examples (a task, a model family) run enough seeds for a verdict: run as
printed but for fewer steps, each report draws a test of the new row against `resnet` over
every seed."""

import re
from pathlib import Path

import pytest

from ddl_dynamics import build_report, list_models, list_tasks
from ddl_dynamics._task import TASKS
from ddl_dynamics.analysis.judge.verdicts import BOTH_SOLVED, EQUIVALENT, INCONCLUSIVE, LOSS, WIN
from ddl_dynamics.cli import main
from ddl_dynamics.experiment import folder as run_folder
from ddl_dynamics.models.base import MODELS

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: The labels of a comparison that was tested (the others say why none was drawn).
TESTED = {WIN, LOSS, EQUIVALENT, INCONCLUSIVE, BOTH_SOLVED}


@pytest.fixture
def scratch_registries(monkeypatch):
    """What the examples register is gone after the test."""
    list_models(), list_tasks()
    monkeypatch.setattr(MODELS, "_factories", dict(MODELS._factories))
    monkeypatch.setattr(TASKS, "_factories", dict(TASKS._factories))
    monkeypatch.setattr(run_folder, "_imported", dict(run_folder._imported))


def blocks(page: str) -> list[str]:
    return [body for _, body in re.findall(r"```(\w+)\n(.*?)```", (DOCS / page).read_text(), re.S)]


@pytest.mark.usefixtures("scratch_registries")
@pytest.mark.parametrize(
    ("page", "code", "toml", "row"),
    [
        ("adding-a-task.md", "# my_task.py", "# swap.toml", "ddl"),
        ("adding-a-model.md", '"""my-decoupled', 'name = "my-study"', "my-decoupled"),
    ],
)
def test_a_worked_example_draws_a_test_over_every_seed(
    tmp_path, monkeypatch, page, code, toml, row
):
    (code_block,) = [b for b in blocks(page) if b.startswith(code)]
    (experiment,) = [b for b in blocks(page) if b.startswith(toml)]
    seeds = len(re.search(r"^seeds = \[(.*?)\]", experiment, re.M).group(1).split(","))
    assert seeds >= 6
    (tmp_path / "example.py").write_text(code_block)
    (tmp_path / "example.toml").write_text(
        re.sub(r"^steps = \d+", "steps = 20", experiment, flags=re.M)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["run", "example.toml", "--task-file", "example.py"]) == 0
    name = re.search(r'^name = "(.*)"', experiment, re.M).group(1)
    (found,) = [
        c
        for c in build_report(tmp_path / "runs" / name).comparisons
        if (c.model, c.control) == (row, "resnet")
    ]
    assert found.label in TESTED and found.paired.total == seeds
