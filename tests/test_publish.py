"""``ddl-dyn publish``: a study's name is never a path, an unfinished run is refused, and a
publish killed at any moment leaves the old study or the new one whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ddl_dynamics.cli import main
from ddl_dynamics.publish.publish import studies


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line error of a command that must fail with exit 2 and no traceback."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith("ddl-dyn: error:")
    return line


def edited(tiny_study: Path, tmp_path: Path, *sql: str) -> Path:
    """A copy of the tiny run folder with ``sql`` applied to its store."""
    run = tmp_path / "run"
    shutil.copytree(tiny_study, run)
    with sqlite3.connect(run / "results.sqlite") as con:
        for statement in sql:
            con.execute(statement)
    return run


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# --- names are never paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../victim", ".", "..", "/tmp/elsewhere", "", "  ", "a\u202eb", "a/b"]
)
def test_a_name_that_is_not_one_plain_path_component_is_refused(tiny_study, tmp_path, capsys, name):
    results = tmp_path / "results"
    (results / "kept").mkdir(parents=True)
    (results / "kept" / "report.json").write_text("{}")
    (tmp_path / "victim").mkdir()
    line = refused(capsys, "publish", str(tiny_study), "--results", str(results), "--name", name)
    assert "a study's name" in line
    assert sorted(p.name for p in results.iterdir()) == ["kept"]
    assert (tmp_path / "victim").is_dir() and (results / "kept" / "report.json").is_file()


def test_the_name_given_is_the_name_inside(tiny_study, tmp_path):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results), "--name", "mystudy"]) == 0
    assert json.loads((results / "mystudy" / "report.json").read_text())["name"] == "mystudy"
    assert json.loads((results / "mystudy" / "run.json").read_text())["study"] == "mystudy"


def test_a_folder_that_is_not_a_study_is_not_replaced(tiny_study, tmp_path, capsys):
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "notes.txt").write_text("mine")
    line = refused(capsys, "publish", str(tiny_study), "--results", str(results))
    assert "is not a published study" in line
    assert (results / "tiny" / "notes.txt").read_text() == "mine"


# --- unfinished runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("UPDATE runs SET ended_at = NULL", "the run did not end"),
        ("DELETE FROM results WHERE seed = 2", "4 of 12 cells missing"),
        ("UPDATE results SET status = 'failed'", "no cell finished"),
    ],
)
def test_an_unfinished_run_is_refused_unless_allowed_and_then_said(
    tiny_study, tmp_path, capsys, sql, said
):
    run = edited(tiny_study, tmp_path, sql)
    results = tmp_path / "results"
    line = refused(capsys, "publish", str(run), "--results", str(results))
    assert said in line and "--allow-partial" in line
    assert not results.exists()
    assert main(["publish", str(run), "--results", str(results), "--allow-partial"]) == 0
    assert said in json.loads((results / "tiny" / "run.json").read_text())["partial"]
    finished = tmp_path / "finished"
    assert main(["publish", str(tiny_study), "--results", str(finished)]) == 0
    assert json.loads((finished / "tiny" / "run.json").read_text())["partial"] == ""


# --- a publish killed at any moment --------------------------------------------------------

#: Runs ``ddl-dyn publish`` (argv in argv[1]) and stops for good just before the N-th call
#: of one filesystem step (argv[2], e.g. ``rename:2``), saying so on stdout.
_STOPPED = """
import json, pathlib, shutil, sys, time
from ddl_dynamics.cli import main
step, count = sys.argv[2].split(":")
calls = {"n": 0}
def stopping(owner, name):
    real = getattr(owner, name)
    def call(*args, **kwargs):
        if name == step:
            calls["n"] += 1
            if calls["n"] == int(count):
                print("stopped", flush=True)
                time.sleep(600)
        return real(*args, **kwargs)
    setattr(owner, name, call)
for owner, name in ((pathlib.Path, "write_text"), (pathlib.Path, "rename"),
                    (shutil, "copyfile"), (shutil, "rmtree")):
    stopping(owner, name)
sys.exit(main(json.loads(sys.argv[1])))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment", ["write_text:1", "write_text:3", "copyfile:1", "rename:1", "rename:2", "rmtree:1"]
)
def test_a_killed_publish_leaves_the_old_or_the_new_study_whole(tiny_study, tmp_path, moment):
    results, expected = tmp_path / "results", tmp_path / "expected"
    study = results / "tiny"
    assert main(["publish", str(tiny_study), "--results", str(results), "--command", "old"]) == 0
    (study / "changes.md").write_text("Hand-written.\n")
    old = tree(study)
    assert main(["publish", str(tiny_study), "--results", str(expected), "--command", "new"]) == 0
    (expected / "tiny" / "changes.md").write_text("Hand-written.\n")
    new = tree(expected / "tiny")
    argv = ["publish", str(tiny_study), "--results", str(results), "--command", "new"]
    child = subprocess.Popen(
        [sys.executable, "-c", _STOPPED, json.dumps(argv), moment],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "stopped\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    if study.exists():
        assert tree(study) in (old, new)
    else:  # killed between moving the old one aside and renaming the new one in
        assert tree(results / ".tiny.old") == old
    assert main(argv) == 0  # the next publish finishes what was left
    assert tree(study) == new
    assert sorted(p.name for p in results.iterdir()) == ["tiny"]


def test_docs_skip_a_study_being_published_and_name_one_moved_aside(tiny_study, tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["publish", str(tiny_study), "--results", str(results)]) == 0
    shutil.copytree(results / "tiny", results / ".other.new")  # a publish under way
    assert studies(results) == [results / "tiny"]
    (results / "tiny").rename(results / ".tiny.old")  # a publish killed between its renames
    line = refused(capsys, "docs", "--results", str(results), "--out", str(tmp_path))
    assert ".tiny.old: a publish was cut short" in line
