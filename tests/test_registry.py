"""The registries find their built-ins from a fresh interpreter, and no module names (as a
string to import later) a module that imports it back: a loop the import contracts cannot
see, since they read only import statements."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ddl_dynamics as dd

ROOT = Path(__file__).resolve().parents[1]
#: Where each part of the package lives (``tasks/`` is installed as ``ddl_dynamics.tasks``).
SOURCES = {"ddl_dynamics": ROOT / "ddl_dynamics", "ddl_dynamics.tasks": ROOT / "tasks"}


def _modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, package: str) -> str:
    """``name`` (``.x``, ``..x`` or absolute) as an absolute module name."""
    if not name.startswith("."):
        return name
    dots = len(name) - len(name.lstrip("."))
    base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
    return f"{base}.{name[dots:]}".rstrip(".")


def _edges(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module: the modules it imports (a public name of the root counts as an import of
    the module that defines it: the root only forwards it), and those it names in a string
    (an f-string names every module its constant prefix starts; an entry-point group's name
    is no module, nor is the root, the facade above every module, named to preload it)."""
    home = {name: _resolve(module, "ddl_dynamics") for name, module in dd._HOME.items()}
    imports: dict[str, set[str]] = {m: set() for m in modules}
    named: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = _package(module, path)
        tree = ast.parse(path.read_text())
        groups = {
            id(k.value)
            for k in ast.walk(tree)
            if isinstance(k, ast.keyword) and k.arg == "entry_point_group"
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports[module].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve("." * node.level + (node.module or ""), package)
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    if source == "ddl_dynamics" and alias.name in home:
                        child = home[alias.name]
                    imports[module].add(child if child in modules else source)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"\.*[A-Za-z_][\w.]*", node.value)
                and id(node) not in groups
            ):
                named[module].update(
                    {_resolve(node.value, package)} & modules.keys() - {"ddl_dynamics"}
                )
            elif (
                isinstance(node, ast.JoinedStr)
                and node.values
                and isinstance(node.values[0], ast.Constant)
                and str(node.values[0].value).startswith("ddl_dynamics.")
            ):
                prefix = str(node.values[0].value)
                named[module].update(m for m in modules if m.startswith(prefix))
    return imports, named


def _reaches(start: str, goal: str, *graphs: dict[str, set[str]]) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(t for graph in graphs for t in graph.get(module, ()))
    return False


def test_no_module_names_a_module_that_imports_it():
    modules = _modules()
    imports, named = _edges(modules)
    assert {"ddl_dynamics._task", "ddl_dynamics.tasks.oscillators"} <= modules.keys()
    assert _reaches("ddl_dynamics.tasks.oscillators", "ddl_dynamics._task", imports)
    loops = sorted(
        (module, target)
        for module, targets in named.items()
        for target in targets
        if target != module and _reaches(target, module, imports, named)
    )
    assert loops == []


@pytest.mark.parametrize(
    "how",
    [
        "import ddl_dynamics._task as dd",
        "from ddl_dynamics import make_task, make_model",
        "import ddl_dynamics.models.base as dd",
    ],
)
def test_built_ins_resolve_from_a_fresh_interpreter(how):
    calls = {
        "import ddl_dynamics._task as dd": "dd.make_task('oscillator')",
        "from ddl_dynamics import make_task, make_model": "make_task('oscillator'), "
        "make_model('resnet', in_dim=2, out_dim=1)",
        "import ddl_dynamics.models.base as dd": "dd.make_model('ddl', in_dim=2, out_dim=1)",
    }
    out = subprocess.run(
        [sys.executable, "-c", f"{how}\nprint([type(x).__name__ for x in [{calls[how]}]])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() in ("['Oscillator']", "['Oscillator', 'ResNet']", "['DeltaModel']")


def test_an_option_is_described_by_a_docstring_body_never_by_a_summary_line(monkeypatch):
    from types import ModuleType

    from ddl_dynamics.tasks.switched import Switched

    from ddl_dynamics._registry import option_docs

    module = ModuleType(
        "summarised",
        "A system: one knob ``p`` from calm to storm.\n\n"
        "Every step an event happens with probability ``p``.",
    )
    monkeypatch.setitem(sys.modules, "summarised", module)
    knob = type("Knob", (), {"__module__": "summarised", "__doc__": "Knob ``p`` of a system."})
    assert option_docs(knob)["p"] == "Every step an event happens with probability ``p``"
    assert "probability ``p``" in option_docs(Switched)["p"]
