"""The API reference shows the API: every public name has an entry, the built page carries
their signatures and no raw Sphinx role, and ``dir(ddl_dynamics)`` lists only the public API."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ddl_dynamics as dd

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "api.md"


def test_dir_lists_only_the_public_api():
    shown = set(dir(dd))
    assert set(dd.__all__) <= shown
    assert {"Any", "Path", "importlib", "version", "annotations"}.isdisjoint(shown)
    assert all(not name.startswith("_") or name == "__version__" for name in shown)


def test_every_public_name_has_an_entry_in_its_home_module():
    entries = set(re.findall(r"^::: (\S+)$", API_PAGE.read_text(), re.M))
    for group in dd.API.values():
        for module, names in group.items():
            for name in names:
                assert f"ddl_dynamics{module}.{name}" in entries, name


@pytest.mark.slow  # builds the site: over 8 s on 2 cores
def test_the_built_api_page_shows_signatures_and_no_sphinx_roles(tmp_path):
    pytest.importorskip("mkdocstrings")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "api" / "index.html").read_text()
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())
    for signature in (
        "make_model( name: str, *, seed: int | None = None, **config: Any )",
        "train( task: Task, model: Module, cfg: TrainConfig, seed: int,",
        "TrainConfig( steps: int = 1000, batch_size: int = 128,",
        "load_results(run: Run | str | Path) -> list[dict[str, Any]]",
        "RunFolder(path: Path, store: ResultStore)",
    ):
        assert signature in text, signature
    for role in (":class:", ":func:", ":meth:", ":mod:", ":data:"):
        assert role not in text, role
    entries = set(re.findall(r'id="(ddl_dynamics\.[\w.]+)"', page))
    assert "ddl_dynamics.experiment.train.train" in entries
    for internal in (
        "analysis.report.wording.number",
        "analysis.report.wording.as_record",
        "experiment.step.member_losses",
    ):
        assert f"ddl_dynamics.{internal}" not in entries, internal
