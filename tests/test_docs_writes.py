"""How ``ddl-dyn docs`` writes: every file through a temporary renamed over it, the README
last, and it removes only what it generated before (its manifest), saying so; a docs run
killed at any moment leaves each file old or new, never half of one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddl_dynamics.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def two(tiny_study, tmp_path) -> tuple[Path, Path]:
    """Two results folders: ``tiny`` and ``gone`` run as "old", and ``tiny`` alone as "new"."""
    old, new = tmp_path / "old", tmp_path / "new"
    for name in ("tiny", "gone"):
        assert (
            main(
                [
                    "publish",
                    str(tiny_study),
                    "--results",
                    str(old),
                    "--name",
                    name,
                    "--command",
                    "old",
                ]
            )
            == 0
        )
    assert main(["publish", str(tiny_study), "--results", str(new), "--command", "new"]) == 0
    return old, new


def site(at: Path) -> Path:
    """A copy of the files ``docs`` rewrites, its study pages left out."""
    at.mkdir()
    for name in ("README.md", "mkdocs.yml", "docs"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, at / name)
    shutil.rmtree(at / "docs" / "studies")
    return at


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_docs_removes_only_what_it_generated_and_says_so(two, tmp_path, capsys):
    old, new = two
    out = site(tmp_path / "site")
    assert main(["docs", "--results", str(old), "--out", str(out)]) == 0
    studies = out / "docs" / "studies"
    assert (studies / "gone.md").is_file() and (studies / "gone" / "compare.png").is_file()
    (studies / "notes.md").write_text("hand-written\n")
    (studies / "gone" / "sketch.txt").write_text("hand-written\n")
    capsys.readouterr()
    assert main(["docs", "--results", str(new), "--out", str(out)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("removed")]
    assert f"removed (generated before, no longer): {studies / 'gone.md'}" in said
    assert not (studies / "gone.md").exists() and not (studies / "gone" / "compare.png").exists()
    assert (studies / "notes.md").read_text() == "hand-written\n"
    assert (studies / "gone" / "sketch.txt").read_text() == "hand-written\n"
    assert (studies / "tiny.md").is_file()


def test_a_damaged_manifest_line_is_refused_not_followed(two, tmp_path, capsys):
    old, _ = two
    out = site(tmp_path / "site")
    (out / "docs" / "studies").mkdir()
    (out / "docs" / "studies" / ".generated").write_text("# list\n../../README.md\n")
    assert main(["docs", "--results", str(old), "--out", str(out)]) == 2
    assert "'../../README.md' is not a page or figure" in capsys.readouterr().err
    assert (out / "README.md").read_bytes() == (ROOT / "README.md").read_bytes()


#: Runs ``ddl-dyn docs`` (argv in argv[1]) and stops for good just before the N-th file it
#: renames into place (argv[2]), saying so on stdout.
_STOPPED = """
import json, pathlib, sys, time
from ddl_dynamics.cli import main
real, calls = pathlib.Path.replace, {"n": 0}
def replace(self, target):
    calls["n"] += 1
    if calls["n"] == int(sys.argv[2]):
        print("stopped", flush=True)
        time.sleep(600)
    return real(self, target)
pathlib.Path.replace = replace
sys.exit(main(json.loads(sys.argv[1])))
"""


@pytest.mark.slow
def test_a_killed_docs_leaves_every_file_old_or_new(two, tmp_path):
    old, new = two
    before = site(tmp_path / "before")
    assert main(["docs", "--results", str(old), "--out", str(before)]) == 0
    after = tmp_path / "after"
    shutil.copytree(before, after)
    assert main(["docs", "--results", str(new), "--out", str(after)]) == 0
    olds, news = tree(before), tree(after)
    changed = sum(olds.get(name) != data for name, data in news.items())
    for moment in sorted({1, 2, changed // 2, changed}):
        out = tmp_path / f"killed{moment}"
        shutil.copytree(before, out)
        argv = ["docs", "--results", str(new), "--out", str(out)]
        child = subprocess.Popen(
            [sys.executable, "-c", _STOPPED, json.dumps(argv), str(moment)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline() == "stopped\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        found = tree(out)
        for name, data in found.items():
            if not name.endswith(".tmp"):  # a temporary the kill left
                assert data in (olds.get(name), news.get(name)), (moment, name)
        assert found["README.md"] == olds["README.md"], moment  # the README goes last
        assert main(argv) == 0
        assert {k: v for k, v in tree(out).items() if not k.endswith(".tmp")} == news
