"""The suite benchmark's wall times, and ``ddl-dyn bench``, which prints every table and
writes the rows as JSON."""

import json

import pytest
import torch

from ddl_dynamics.bench.suite import bench_suite, format_suite_table
from ddl_dynamics.cli import main


def tiny_experiment(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(
        'name = "b"\nseeds = [0, 1]\n[defaults.model]\nwidth = 8\ndepth = 3\n'
        "[defaults.train]\nsteps = 5\nn_train = 32\nn_test = 16\n"
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
        '[[models]]\nname = "ddl"\n'
    )
    return path


@pytest.mark.slow  # trains a suite once per setting
def test_bench_suite_runs_the_experiment_once_per_setting(tmp_path):
    rows = bench_suite(tiny_experiment(tmp_path), only={"model": ["ddl"]})
    assert [(r["vectorize"], r["jobs"]) for r in rows] == [
        (False, 1),
        (True, 1),
        (False, 2),
        (True, 2),
    ]
    for r in rows:
        assert r["counts"] == {"ok": 2} and r["cells"] == 2 and r["wall_s"] > 0
        assert r["x_first"] == pytest.approx(r["wall_s"] / rows[0]["wall_s"])
    assert len(format_suite_table(rows).splitlines()) == 5
    assert not list(tmp_path.glob("runs*"))  # every run in its own temporary folder


def test_bench_command_prints_tables_and_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = [
        "bench",
        "--parts",
        "suite,cuda",
        "--experiment",
        str(tiny_experiment(tmp_path)),
        "--only",
        "model=resnet",
        "--seeds",
        "0",
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert [r["cells"] for r in results["suite"]] == [1, 1, 1, 1]
    assert "wall s" in printed and f"bench: {out}" in printed
    if not torch.cuda.is_available():
        assert results["cuda"] == {"skipped": "CUDA is not available here"}
        assert "cuda: skipped" in printed
    assert main(["bench", "--parts", "steps,gpu", "--output", str(out)]) == 2
    assert "unknown benchmark 'gpu'" in capsys.readouterr().err
