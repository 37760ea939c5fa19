"""A JSON value checked against the type hints of the dataclass it was written from.

A published study's ``report.json`` is a `Report` written as JSON
(`render_json`). What reads it back (``docs``, ``compare``) trusts each
field's type, so a hand-edited or damaged file is checked first, field by field, against the
same dataclasses: a damaged field is named where it is (``comparisons[3].paired.mean``), never
met as a traceback deep inside a page. Keys the dataclasses do not know are let through
(later writers add some), and a missing field is damage only where it has no default.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal


class DamagedError(ValueError):
    """A field of a JSON file that does not fit the dataclass it was written from."""


def check_shape(value: Any, hint: Any, where: str) -> None:
    """Raise `DamagedError` naming the first field of ``value`` (at ``where``) that
    does not fit ``hint``: a dataclass, a union, a ``Literal``, a list, tuple or dict of
    them, ``str``, ``int``, ``float`` (finite, or ``None``: `render_json`
    writes a non-finite one so, e.g. a crossover interval's open end) or ``bool``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        _check_dataclass(value, hint, where)
    elif origin in (typing.Union, types.UnionType):
        _check_union(value, args, where)
    elif origin is Literal:
        if value not in args:
            raise DamagedError(
                f"{where}: expected one of {', '.join(map(repr, args))}, got {_shown(value)}"
            )
    elif origin in (list, tuple) or hint in (list, tuple):
        _check_sequence(value, args, origin is tuple, where)
    elif hint is dict or origin in (dict, Mapping):
        _check_mapping(value, args, where)
    elif hint is float:
        if value is not None and not (_is_number(value) and math.isfinite(value)):
            raise DamagedError(f"{where}: expected a finite number, got {_shown(value)}")
    elif hint is int:
        if type(value) is not int:
            raise DamagedError(f"{where}: expected an integer, got {_shown(value)}")
    elif hint in (str, bool) and not isinstance(value, hint):
        raise DamagedError(
            f"{where}: expected {'text' if hint is str else 'true or false'}, got {_shown(value)}"
        )
    elif hint is type(None) and value is not None:
        raise DamagedError(f"{where}: expected null, got {_shown(value)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_dataclass(value: Any, cls: type, where: str) -> None:
    if not isinstance(value, dict):
        raise DamagedError(f"{where}: expected an object, got {_shown(value)}")
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        inner = f"{where}.{f.name}" if where else f.name
        if f.name in value:
            check_shape(value[f.name], hints[f.name], inner)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DamagedError(f"{inner}: missing")


def _check_union(value: Any, args: tuple[Any, ...], where: str) -> None:
    if value is None and type(None) in args:
        return
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        check_shape(value, options[0], where)
        return
    for option in options:
        try:
            check_shape(value, option, where)
            return
        except DamagedError:
            continue
    raise DamagedError(
        f"{where}: expected {' or '.join(map(_named, options))}, got {_shown(value)}"
    )


def _check_sequence(value: Any, args: tuple[Any, ...], fixed: bool, where: str) -> None:
    if not isinstance(value, list):
        raise DamagedError(f"{where}: expected a list, got {_shown(value)}")
    if fixed and args and args[-1] is not Ellipsis:  # tuple[A, B]: one item per position
        if len(value) != len(args):
            raise DamagedError(f"{where}: expected {len(args)} items, got {len(value)}")
        items = list(zip(value, args, strict=True))
    else:
        items = [(item, args[0] if args else Any) for item in value]
    for i, (item, hint) in enumerate(items):
        check_shape(item, hint, f"{where}[{i}]")


def _check_mapping(value: Any, args: tuple[Any, ...], where: str) -> None:
    if not isinstance(value, dict):
        raise DamagedError(f"{where}: expected an object, got {_shown(value)}")
    key_hint, value_hint = args or (Any, Any)
    for key, item in value.items():
        if key_hint is int:  # JSON keys are text: an integer key is written as its digits
            try:
                int(key)
            except ValueError:
                raise DamagedError(f"{where}: key {key!r} is not an integer") from None
        check_shape(item, value_hint, f"{where}[{key!r}]")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _named(hint: Any) -> str:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return "an object"
    return {str: "text", int: "an integer", float: "a number", bool: "true or false"}.get(
        hint, "a list" if typing.get_origin(hint) in (list, tuple) else str(hint)
    )


def _shown(value: Any) -> str:
    """A value as an error message shows it: short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"
