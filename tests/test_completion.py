"""``ddl-dyn completion bash|zsh``: a script from the parser that completes subcommands,
options, their choices and the task and model names, files elsewhere."""

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from ddl_dynamics.cli import main

#: Completes the words given (the last one being typed) as bash would, one line per call.
HARNESS = """
source {script}
at() {{
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMPREPLY=()
    _ddl_dyn
    echo "${{COMPREPLY[*]}}"
}}
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("completion")
    for shell in ("bash", "zsh"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["completion", shell]) == 0
        (folder / f"ddl-dyn.{shell}").write_text(out.getvalue())
    return folder


def _bash(scripts, *calls):
    lines = [HARNESS.format(script=scripts / "ddl-dyn.bash")]
    lines += ["at ddl-dyn " + " ".join(f"'{w}'" for w in words) for words in calls]
    done = subprocess.run(
        ["bash", "-c", "\n".join(lines)], capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_bash_completes_commands_options_choices_and_names(scripts):
    assert _bash(
        scripts,
        ["r"],
        ["plot", ""],
        ["report", "runs/x", "--format", "h"],
        ["report", "runs/x", "--format", "=", "j"],
        ["run", "exp.toml", "--dev"],
        ["tasks", "par"],
        ["models", "ddl-d"],
        ["completion", ""],
    ) == [
        "run report",
        "regimes trajectories curves compare crossover hops queries width all",
        "html",
        "json",
        "--device",
        "parity",
        "ddl-decoupled",
        "bash zsh",
    ]


def test_bash_leaves_files_and_free_values_to_the_shell(scripts):
    # nothing offered: `complete -o default` then completes file names
    assert _bash(
        scripts,
        ["plot", "curves", ""],
        ["run", "--jobs", "2", ""],
        ["run", "--jobs", ""],
        ["compare", "runs/x", ""],
    ) == ["", "", "", ""]


def test_a_task_files_names_are_completed_too(capsys):
    task_file = Path(__file__).resolve().parent / "custom_tasks.py"
    assert main(["completion", "bash", "--task-file", str(task_file)]) == 0
    assert " tiny-sum " in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_runs_the_same_function_through_bashcompinit(scripts, tmp_path):
    body = (
        f"source {scripts / 'ddl-dyn.zsh'}\n"
        'at() { emulate -L sh; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        'COMPREPLY=(); _ddl_dyn; echo "${COMPREPLY[*]}"; }\n'
        "at ddl-dyn report runs/x --format ''\nat ddl-dyn plot ''\n"
    )
    done = subprocess.run(
        ["zsh", "-f", "-c", body],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert done.stdout.splitlines() == [
        "csv json md html",
        "regimes trajectories curves compare crossover hops queries width all",
    ]
