"""The library's wings import one way: cli → analysis → experiment → task interface → models →
registry, and no two sibling modules import each other. The contracts live in pyproject.toml
(``[tool.importlinter]``); import-linter checks them, lazy imports inside functions included."""

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
