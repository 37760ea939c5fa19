"""The library's wings import one way: cli → publish → analysis → experiment → built-in tasks →
task interface → models → option checks → registry; inside analysis, render → figures →
captions → plots → report → the probe audits → judge → what reads a run; and no two sibling
modules import each other. The contracts live in pyproject.toml (``[tool.importlinter]``);
import-linter checks them, lazy imports inside functions included. And a module holds one
idea: none is longer than :data:`MAX_LINES` lines; a function does one thing: none is longer
than :data:`MAX_FUNCTION_LINES`."""

import ast
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddl_dynamics"

#: The most lines a module of the package may have, as `ruff format` lays it out; past it,
#: it holds several ideas.
MAX_LINES = 500
#: The most lines a function (or method) may span, signature and docstring included; past
#: it, it does several things.
MAX_FUNCTION_LINES = 60


def test_import_contracts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # the contract reads the folder tasks/ as `tasks`
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_no_module_of_the_package_exceeds_the_line_limit() -> None:
    lengths = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    over = [f"{name} ({n} lines)" for name, n in lengths.items() if n > MAX_LINES]
    assert not over, f"over {MAX_LINES} lines, split by idea: {', '.join(over)}"


def test_no_function_of_the_package_exceeds_the_line_limit() -> None:
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    name = path.relative_to(PACKAGE).as_posix()
                    over.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not over, f"over {MAX_FUNCTION_LINES} lines, split by step: {', '.join(over)}"
