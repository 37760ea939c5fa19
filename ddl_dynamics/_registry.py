"""One generic name → factory registry, shared by tasks and models.

Names resolve in this order: registered here (the built-in modules are imported on the first
lookup, so no caller has to import them first), then ``"module:Name"`` import paths, then the
package entry-point group (scanned lazily, once). Unknown names fail with one ``ValueError``
that lists the valid names and a did-you-mean hint.

A kind's built-ins register by being in its package: on the first lookup every public module
of that package is imported. Which package that is, is said from above (`BUILTINS`, filled
by the package's root), so the module that defines a registry never names the modules that
register into it: imports run one way, from the built-ins to the registry.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Per kind of registry (``"task"``, ``"model"``), the package whose public modules register
#: its built-in names, each imported on the registry's first lookup (`import_package`).
BUILTINS: dict[str, str] = {}


def did_you_mean(name: str, choices: list[str]) -> str:
    """A ``" Did you mean 'x'?"`` suffix for error messages, or ``""``."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def first_paragraph(obj: object) -> str:
    """The docstring's first paragraph as one line: a summary never cut mid-sentence."""
    doc = (inspect.getdoc(obj) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def option_docs(obj: object) -> dict[str, str]:
    """What the documentation of ``obj`` (a class: along its bases) says of each option, for
    listings: a ``#:`` comment above a field, an ``Args:``/``Options:`` entry ``name: text``,
    the parenthesis after ````name```` in a docstring, else the first clause that names it
    (the class's docstring, then its module's), their summary lines aside: a summary
    describes the whole object, not the option it names."""
    docs: dict[str, str] = {}
    classes = [c for c in getattr(obj, "__mro__", (obj,)) if c is not object]
    for cls in classes:
        for name, text in [*_field_comments(cls).items(), *_entries(cls.__doc__ or "").items()]:
            docs.setdefault(name, text)
    texts = [inspect.getdoc(c) or "" for c in classes]
    texts += [inspect.getdoc(sys.modules.get(c.__module__)) or "" for c in classes]
    bodies = [" ".join(text.partition("\n\n")[2].split()) for text in texts]
    texts = [" ".join(text.split()) for text in texts]
    for text in texts:
        for name, said in re.findall(r"``(\w+)`` \(([^()]*(?:\([^()]*\)[^()]*)*)\)", text):
            docs.setdefault(name, said)
    clauses = [clause for text in bodies for clause in _clauses(text)]
    named = [(clause, set(re.findall(r"``(\w+)``", clause))) for clause in clauses]
    for clause, names in sorted(named, key=lambda pair: len(pair[1])):  # the most specific
        for name in names:
            docs.setdefault(name, clause)
    return {name: text.rstrip(".;") for name, text in docs.items()}


def _field_comments(cls: object) -> dict[str, str]:
    """``#: text`` comments above ``name: type`` lines in a class's source."""
    try:
        lines = inspect.getsource(cls).splitlines()  # type: ignore[arg-type]
    except (OSError, TypeError):
        return {}
    docs, comment = {}, []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        field = re.match(r"(\w+)\s*:", stripped)
        if field and comment:
            docs[field[1]] = " ".join(comment)
        comment = []
    return docs


def _entries(doc: str) -> dict[str, str]:
    """Google-style ``name: text`` entries under ``Args:``, ``Options:`` or ``Attributes:``,
    continuation lines included; ``a: text. b: text.`` on one line gives two."""
    entries: dict[str, str] = {}
    section, current = False, ""
    for line in inspect.cleandoc(doc).splitlines():
        if re.fullmatch(r"(Args|Options|Attributes):", line.strip()):
            section, current = True, ""
            continue
        if not line.startswith(" "):
            section = section and not line.strip()
            current = ""
            continue
        if not section:
            continue
        start = re.match(r"    (\w+(?:, \w+)*): (.*)", line)
        if start:
            text = start[2]
            for names, said in re.findall(
                r"(?:^|(?<=\. ))(\w+(?:, \w+)*): (.*?)(?=\. \w+: |$)", f"{start[1]}: {text}"
            ):
                for name in names.split(", "):
                    entries[name] = said.strip()
                current = names.split(", ")[-1]
        elif current:
            entries[current] += " " + line.strip()
    return entries


def _clauses(text: str) -> list[str]:
    """``text`` cut into clauses at ``. `` and ``; `` outside parentheses (those of
    ````literals```` aside)."""
    clauses, depth, start = [], 0, 0
    literal = False
    for i, char in enumerate(text):
        literal ^= text[i : i + 2] == "``" and text[i - 1 : i] != "`"
        depth += 0 if literal else {"(": 1, ")": -1}.get(char, 0)
        if depth <= 0 and char in ".;" and text[i + 1 : i + 2] in (" ", ""):
            clauses.append(text[start : i + 1].strip())
            start = i + 1
    clauses.append(text[start:].strip())
    return [c for c in clauses if c]


class Registry(Generic[T]):
    """Maps names to factories (classes or functions) of one kind of object."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._factories: dict[str, Callable[..., T]] = {}
        self._scanned = entry_point_group is None
        self._loaded = False

    def register(
        self, name: str, factory: Callable[..., T] | None = None, *, overwrite: bool = False
    ) -> Any:
        """Register ``factory`` under ``name``; usable as ``@registry.register("name")``."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories and self._factories[name] is not f and not overwrite:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = f
            return f

        return add(factory) if factory is not None else add

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # first: the modules register through this registry
        if self.kind in BUILTINS:
            import_package(BUILTINS[self.kind])

    def _scan_entry_points(self) -> None:
        self._load_builtins()
        group = self.entry_point_group
        if self._scanned or group is None:  # no group: scanned from the start
            return
        self._scanned = True
        for ep in entry_points(group=group):
            if ep.name not in self._factories:
                self._factories[ep.name] = ep.load()

    def names(self) -> list[str]:
        self._scan_entry_points()
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., T]:
        """The factory for ``name`` (a registered name or ``"module:Name"``)."""
        self._load_builtins()
        if name in self._factories:
            return self._factories[name]
        if ":" in name:
            module_name, _, attr = name.partition(":")
            return getattr(importlib.import_module(module_name), attr)
        self._scan_entry_points()
        if name in self._factories:
            return self._factories[name]
        names = self.names()
        raise ValueError(
            f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(names)}."
            + did_you_mean(name, names)
        )

    def make(self, name: str, **kwargs: Any) -> T:
        return self.get(name)(**kwargs)

    def describe(self) -> Iterator[tuple[str, str]]:
        """``(name, first docstring paragraph)`` for every registered name."""
        for name in self.names():
            yield name, first_paragraph(self._factories[name])

    def __contains__(self, name: str) -> bool:
        return name in self._factories or name in self.names()


def import_package(name: str) -> None:
    """Import the package ``name`` and every public module in it (one whose name starts with
    an underscore is private: it loads where it is used, as a kernel that needs an optional
    dependency)."""
    package = importlib.import_module(name)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{name}.{module.name}")


def load_file(path: str | Path) -> None:
    """Import a Python file so that its ``register_*`` calls run (``--task-file``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    module_name = f"ddl_dynamics_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit, KeyboardInterrupt) as err:  # the user's file is broken
        # (even one calling sys.exit or raising KeyboardInterrupt): say where, not a traceback
        del sys.modules[module_name]
        if isinstance(err, SyntaxError):
            line = f" at line {err.lineno}" if err.lineno else ""
            raise ValueError(f"{path}: syntax error{line}: {err.msg}") from err
        raised = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise ValueError(f"{path}: importing it raised {raised}") from err
