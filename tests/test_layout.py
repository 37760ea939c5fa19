"""The library's wings import one way: cli → publish → analysis → experiment → built-in tasks →
task interface → models → option checks → registry; inside analysis, render → figures → plots →
report → the probe audits → judge → what reads a run; and no two sibling modules import each
other. The contracts live in pyproject.toml (``[tool.importlinter]``); import-linter checks
them, lazy imports inside functions included. And a module holds one idea: none holds more than
:data:`MAX_LINES` lines of code; a function does one thing: none more than
:data:`MAX_FUNCTION_LINES`."""

import ast
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddl_dynamics"

#: The most lines of code a module of the package may hold; past it, it holds several ideas.
MAX_LINES = 500
#: The most lines of code a function (or method) may hold; past it, it does several things.
MAX_FUNCTION_LINES = 60


def test_import_contracts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # the contract reads the folder tasks/ as `tasks`
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def code_lines(node: ast.AST, source: list[str]) -> int:
    """The lines of ``node`` (a module, or a function's body) that hold code, as `ruff
    format` lays them out: not a docstring, a blank line or a comment, which say why and cost
    no idea."""
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (
            isinstance(inner, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
    first = node.body[0].lineno if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else 1
    last = getattr(node, "end_lineno", None) or len(source)
    return sum(
        1
        for number in range(first, last + 1)
        if number not in docstrings
        and source[number - 1].strip()
        and not source[number - 1].strip().startswith("#")
    )


def test_no_module_of_the_package_exceeds_the_line_limit() -> None:
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if (lines := code_lines(ast.parse(source), source.splitlines())) > MAX_LINES:
            over.append(f"{path.relative_to(PACKAGE).as_posix()} ({lines} lines)")
    assert not over, f"over {MAX_LINES} lines of code, split by idea: {', '.join(over)}"


def test_no_function_of_the_package_exceeds_the_line_limit() -> None:
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = code_lines(node, source.splitlines())
                if lines > MAX_FUNCTION_LINES:
                    name = path.relative_to(PACKAGE).as_posix()
                    over.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not over, f"over {MAX_FUNCTION_LINES} lines of code, split by step: {', '.join(over)}"
