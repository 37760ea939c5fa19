"""Checks of option values whose errors name what is valid, shared by the model families and
the kernels below them (a module of its own, so that a kernel needs no model to check its
arguments)."""

from __future__ import annotations

import numbers

from ._registry import did_you_mean


def check_choice(what: str, value: str, choices: tuple[str, ...] | list[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` with a did-you-mean hint."""
    if value not in choices:
        raise ValueError(
            f"unknown {what} {value!r}; choose from {', '.join(choices)}."
            + did_you_mean(str(value), list(choices))
        )
    return value


def check_int(what: str, value: int, minimum: int) -> int:
    """``value`` as an ``int`` if it is an integer (not a bool) of at least ``minimum``, else a
    ``ValueError`` saying so."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)
