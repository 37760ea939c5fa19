"""Shell completion for ``ddl-dyn``, written from the command line's own parser.

`script` turns the parser (every subcommand built) into a bash completion function: the
subcommands, each one's options, the choices of an option or argument that has a fixed set
(``--device``, ``--format``, a figure kind, a registered task or model name) and file names
everywhere else. zsh runs the same function through its bash compatibility layer
(``bashcompinit``), so one script serves both shells. The script is a snapshot: saved once
(``ddl-dyn completion bash > FILE``) it needs no Python at the prompt, and is written again
after an upgrade, or to complete a task file's names.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable, Mapping, Sequence

#: The shells a script can be written for.
SHELLS = ("bash", "zsh")
#: What zsh needs first: its completion system, then its bash compatibility layer.
ZSH_PREAMBLE = """\
(( $+functions[compdef] )) || { autoload -U +X compinit && compinit }
autoload -U +X bashcompinit && bashcompinit
"""
#: The completion function: ``_ddl_dyn_options``, ``_ddl_dyn_takes`` and
#: ``_ddl_dyn_choices`` (a subcommand's options, those that take a value, and the choices
#: of an option or of the Nth argument, ``@N``) are written beside it from the parser.
FUNCTION = """\
_ddl_dyn() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    if (( COMP_CWORD <= 1 )); then
        COMPREPLY=($(compgen -W "%(commands)s" -- "$cur"))
        return 0
    fi
    local command="${COMP_WORDS[1]}"
    local takes=" $(_ddl_dyn_takes "$command") "
    [[ "$cur" == "=" ]] && cur=""  # --format=<TAB>: bash splits the word at '='
    [[ "$prev" == "=" ]] && prev="${COMP_WORDS[COMP_CWORD-2]}"
    if [[ "$takes" == *" $prev "* ]]; then
        COMPREPLY=($(compgen -W "$(_ddl_dyn_choices "$command" "$prev")" -- "$cur"))
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_ddl_dyn_options "$command")" -- "$cur"))
        return 0
    fi
    local i word n=0 skip=0
    for (( i = 2; i < COMP_CWORD; i++ )); do
        word="${COMP_WORDS[i]}"
        if [[ "$word" == "=" ]]; then skip=1; continue; fi
        if (( skip )); then skip=0; continue; fi
        if [[ "$word" == -* ]]; then
            [[ "$takes" == *" $word "* ]] && skip=1
            continue
        fi
        n=$((n + 1))
    done
    COMPREPLY=($(compgen -W "$(_ddl_dyn_choices "$command" "@$n")" -- "$cur"))
}
complete -o default -F _ddl_dyn ddl-dyn
"""


def _words(values: Iterable[object]) -> str:
    return " ".join(shlex.quote(str(v)) for v in values)


def _case(function: str, arms: Mapping[str, str]) -> str:
    """A shell function that echoes the words of the arm its arguments name."""
    lines = [f"{function}() {{", '    case "$*" in']
    lines += [
        f"        {shlex.quote(key)}) echo {shlex.quote(words)} ;;"
        for key, words in arms.items()
        if words
    ]
    return "\n".join([*lines, "    esac", "}", ""])


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name (none where it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _arms(
    name: str, parser: argparse.ArgumentParser, names: Sequence[str]
) -> tuple[str, str, dict[str, str]]:
    """A subcommand's options, those that take a value, and its choices by option or by
    argument (``@0``: its first argument's, ``names`` where it states none)."""
    options: list[str] = []
    takes: list[str] = []
    choices: dict[str, str] = {}
    position = 0
    for action in parser._actions:
        if action.option_strings:
            options += action.option_strings
            if action.nargs != 0:
                takes += action.option_strings
                choices.update(
                    {f"{name} {o}": _words(action.choices or ()) for o in action.option_strings}
                )
        else:
            choices[f"{name} @{position}"] = _words(
                action.choices or (names if position == 0 else ())
            )
            position += 1
    return _words(options), _words(takes), choices


def script(
    parser: argparse.ArgumentParser, shell: str, prog: str, names: Mapping[str, Sequence[str]]
) -> str:
    """The completion script for ``shell`` (`SHELLS`) of ``parser``, whose subcommands are
    all built; ``names`` completes the first argument of a subcommand that lists no
    choices (the task and model names)."""
    if shell not in SHELLS:
        raise ValueError(f"completion: no script for {shell!r}; one of {', '.join(SHELLS)}")
    commands = subcommands(parser)
    options: dict[str, str] = {}
    takes: dict[str, str] = {}
    choices: dict[str, str] = {}
    for name, sub in commands.items():
        options[name], takes[name], mine = _arms(name, sub, names.get(name, ()))
        choices.update(mine)
    top = [*commands, *(o for a in parser._actions for o in a.option_strings)]
    head = (
        f"# {prog} completion for {shell}, written by `{prog} completion {shell}`; load it "
        f"from ~/.{shell}rc (see the docs' Getting started)\n"
    )
    return "\n".join(
        [
            head + (ZSH_PREAMBLE if shell == "zsh" else ""),
            _case("_ddl_dyn_options", options),
            _case("_ddl_dyn_takes", takes),
            _case("_ddl_dyn_choices", choices),
            FUNCTION % {"commands": _words(top)},
        ]
    )
