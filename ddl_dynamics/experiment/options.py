"""What a run changes of its experiment file: ``--set``, ``--seeds`` and ``--only``.

A rerun shrinks or varies a study without copying its file: ``--set KEY=VALUE`` sets any key
of the file (`apply`), ``--seeds`` the seeds, ``--only`` the labels that run. The options are
recorded below the file's text in the run's record (`recorded`), so that the record still
reads as the file, and `effective_config` gives back the config as it ran, and `changes`
says how a rerun's config differs from a reference's.

A key is a dotted TOML key path into the file, ``defaults.train.steps``; ``train.``,
``model.`` and ``tune.`` stand for ``defaults.train.`` and so on, and an entry of
``[[tasks]]``, ``[[models]]``, ``[[overrides]]`` or ``[[comparisons]]`` is named by its label
(``tasks.parity.spec.length``; a model's label is its name where it has none) or its index
(``comparisons.0.split``). A value is a TOML literal (``300``, ``[1e-3, 1e-2]``, ``true``);
one that is none reads as a string (``variant=1d``). The result is checked exactly as the
file is, so an unknown key fails with the same did-you-mean.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._registry import did_you_mean
from .config import MAX_GRID, ConfigError, check_limit

#: The line below which a run's record lists the options it ran with.
MARKER = "# ddl-dyn run options, applied to the file above:"
#: Key paths that start with one of these stand for ``defaults.<key>``.
SHORTHAND = ("model", "train", "tune")


@dataclass(frozen=True)
class RunOptions:
    """What a run changes of its file: ``sets`` as ``KEY=VALUE``; ``seeds`` a count (the
    file's first seeds, continued past its largest where it has fewer) or the seeds
    themselves; ``only`` the labels to run (`parse_only`)."""

    sets: tuple[str, ...] = ()
    seeds: int | tuple[int, ...] | None = None
    only: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The options as the record lists them, one per line."""
        seeds = (
            None
            if self.seeds is None
            else str(self.seeds)
            if isinstance(self.seeds, int)
            else ",".join(map(str, self.seeds))
        )
        only = ",".join(f"{axis}={label}" for axis, labels in self.only.items() for label in labels)
        return (
            [f"--set {s}" for s in self.sets]
            + ([f"--seeds {seeds}"] if seeds else [])
            + ([f"--only {only}"] if only else [])
        )


def parse_only(text: str) -> dict[str, list[str]]:
    """``task=a,model=b,model=c`` → ``{"task": ["a"], "model": ["b", "c"]}``; a comma that
    starts no ``task=`` or ``model=`` belongs to a label (``task=switched[event=reflect,p=0]``)."""
    only: dict[str, list[str]] = {}
    for part in re.split(r",(?=\s*(?:task|model)\s*=)", text):
        axis, sep, label = part.partition("=")
        if not sep or axis.strip() not in ("task", "model") or not label.strip():
            raise ValueError(f"--only: expected task=LABEL or model=LABEL, got {part!r}")
        only.setdefault(axis.strip(), []).append(label.strip())
    return only


def parse_seeds(text: str) -> int | tuple[int, ...]:
    """``3`` → the count 3; ``0,1,2`` → those seeds (checked with the experiment's)."""
    try:
        values = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(
            f"--seeds: expected a count like 3 or seeds like 0,1,2, got {text!r}"
        ) from None
    if "," in text:
        return values
    if values[0] < 1:
        raise ValueError(f"--seeds: a count is at least 1, got {text!r} (one seed 0: --seeds 1)")
    check_limit(f"--seeds: {values[0]:,} seeds", values[0], MAX_GRID)
    return values[0]


def apply(data: Mapping[str, Any], options: RunOptions, source: str) -> dict[str, Any]:
    """A copy of an experiment file's dict with ``options``' keys and seeds set (a
    `ConfigError` where a key path leads nowhere)."""
    data = dict(copy.deepcopy(data))
    for assignment in options.sets:
        path, value = _assignment(assignment, source)
        _put(data, path, value, source, assignment)
    if isinstance(options.seeds, int):
        seeds = data.get("seeds", [0])
        if isinstance(seeds, list) and seeds and all(type(s) is int for s in seeds):
            data["seeds"] = (seeds + list(range(max(seeds) + 1, max(seeds) + 1 + options.seeds)))[
                : options.seeds
            ]
    elif options.seeds is not None:
        data["seeds"] = list(options.seeds)
    return data


def recorded(text: str, options: RunOptions) -> str:
    """A file's text with the options it runs with listed below it, as TOML comments (the
    record still reads as the file); the text itself where there are none."""
    lines = options.lines()
    return (
        text
        if not lines
        else "\n".join([text.rstrip("\n"), "", MARKER, *(f"# {line}" for line in lines)]) + "\n"
    )


def effective_config(text: str, source: str = "<record>") -> dict[str, Any]:
    """The config a run's record (`recorded`) says it ran: the file's dict with the
    recorded ``--set`` and ``--seeds`` applied, and ``only`` (``{"task": [...]}``) where it
    ran a subset."""
    data = tomllib.loads(text)
    _, marker, block = text.rpartition(MARKER + "\n")
    sets, seeds, only = [], None, {}
    for line in block.splitlines() if marker else []:
        option, _, value = line.removeprefix("# ").partition(" ")
        if option == "--set":
            sets.append(value)
        elif option == "--seeds":
            seeds = parse_seeds(value)
        elif option == "--only":
            only = parse_only(value)
    data = apply(data, RunOptions(tuple(sets), seeds), source)
    return {**data, "only": only} if only else data


def changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """``key old → new`` for every value that differs between two configs (``—``: absent),
    nested keys dotted and an array of tables' entries named as ``--set`` names them."""
    for key in sorted(old.keys() | new.keys()):
        a, b = _entries(old.get(key)), _entries(new.get(key))
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            yield from changes(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key} {_shown(a)} → {_shown(b)}"


def _entries(value: Any) -> Any:
    """An array of tables as a table of its entries by label (`_entry`), or by index where
    labels repeat; any other value as it is."""
    if not isinstance(value, list) or not value or not all(isinstance(e, dict) for e in value):
        return value
    labels = [str(e.get("label", e.get("name", i))) for i, e in enumerate(value)]
    unique = len(set(labels)) == len(labels)
    return dict(zip(labels if unique else map(str, range(len(value))), value, strict=True))


def _shown(value: Any) -> str:
    return "—" if value is None else repr(value)


def _assignment(assignment: str, source: str) -> tuple[list[str], Any]:
    """``KEY=VALUE`` as a key path and a value (a string where VALUE is no TOML literal)."""
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(source, "--set", f"expected KEY=VALUE, got {assignment!r}")
    try:
        parsed = tomllib.loads(assignment)
    except tomllib.TOMLDecodeError:
        try:
            parsed = tomllib.loads(f"{key} = {json.dumps(value.strip())}")
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(
                source, "--set", f"{key.strip()!r} is not a TOML key path ({err})"
            ) from None
    path: list[str] = []
    node: Any = parsed
    while isinstance(node, dict) and len(node) == 1 and len(path) < key.count(".") + 1:
        ((name, node),) = node.items()
        path.append(name)
    return path, node


def _put(
    data: dict[str, Any], path: Sequence[str], value: Any, source: str, assignment: str
) -> None:
    """Set ``value`` at ``path`` of ``data``, creating tables on the way."""
    path = ["defaults", *path] if path[0] in SHORTHAND else list(path)
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = ".".join(path[: i + 1])
        if isinstance(node, list):
            node = _entry(node, part, ".".join(path[:i]), source)
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, dict | list):
            raise ConfigError(source, where, f"--set {assignment}: {where} is a value, not a table")
    if isinstance(node, list):
        raise ConfigError(
            source, ".".join(path), f"--set {assignment}: set a key of an entry, not a whole entry"
        )
    node[path[-1]] = value


def _entry(entries: list[Any], name: str, where: str, source: str) -> Any:
    """The entry of an array of tables named by its label (a name where it has none) or its
    index."""
    labels = [e.get("label", e.get("name")) if isinstance(e, dict) else None for e in entries]
    if name in labels:
        return entries[labels.index(name)]
    if name.isdigit() and int(name) < len(entries):
        return entries[int(name)]
    known = [str(label) for label in labels if label is not None]
    raise ConfigError(
        source,
        f"{where}.{name}",
        f"no entry labelled {name!r}; labels: "
        f"{', '.join(known) or 'none'} (or an index below {len(entries)})."
        + did_you_mean(name, known),
    )
