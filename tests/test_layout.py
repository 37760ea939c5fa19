"""The library's wings import one way: analysis → experiment → task interface → models →
registry. A module may import its own wing and any wing below it, never one above."""

import ast
from pathlib import Path

import pytest

import ddl_dynamics

PACKAGE = Path(ddl_dynamics.__file__).parent
#: Lower rank = lower layer; a module may import ranks ≤ its own.
RANKS = {"_registry": 0, "models": 1, "_task": 2, "experiment": 3, "analysis": 4}


def _wing(parts: tuple[str, ...]) -> str | None:
    return parts[0] if parts and parts[0] in RANKS else None


def _imported_wings(path: Path) -> set[str]:
    """The wings a module imports, resolved from its relative and absolute imports."""
    package = path.relative_to(PACKAGE).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = (*base, *(node.module or "").split(".")) if node.module else base
                names = [target] if node.module else [(*base, a.name) for a in node.names]
            elif (node.module or "").startswith("ddl_dynamics."):
                names = [tuple(node.module.split(".")[1:])]
            else:
                continue
            found |= {w for parts in names if (w := _wing(tuple(p for p in parts if p)))}
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py")
                 if _wing(p.relative_to(PACKAGE).with_suffix("").parts))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path: Path) -> None:
    own = _wing(path.relative_to(PACKAGE).with_suffix("").parts)
    upward = {w for w in _imported_wings(path) if RANKS[w] > RANKS[own]}
    assert not upward, f"{path.name} ({own}) imports the higher wing(s) {sorted(upward)}"


def test_every_wing_is_checked() -> None:
    checked = {_wing(p.relative_to(PACKAGE).with_suffix("").parts) for p in MODULES}
    assert checked == set(RANKS)
