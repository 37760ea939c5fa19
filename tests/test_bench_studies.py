"""``ddl-dyn bench --parts studies``: each shipped study's longest group, eager and at the
default compile setting, in a process of its own with inductor's cache cold."""

import json

import pytest

from ddl_dynamics.bench.studies import bench_studies, format_studies_table, longest_row
from ddl_dynamics.cli import main


def tiny_results(tmp_path):
    """A results folder of one study whose run spent longest on ``hc``."""
    study = tmp_path / "results" / "tiny"
    study.mkdir(parents=True)
    (study / "experiment.toml").write_text(
        'name = "tiny"\nseeds = [0, 1, 2]\n[defaults.model]\nwidth = 8\ndepth = 3\n'
        "[defaults.train]\nsteps = 12\nn_train = 32\nn_test = 16\n"
        "[defaults.tune]\nlr = [1e-3, 1e-2]\n"
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n[[models]]\nname = "hc"\n'
    )
    rows = [("overwrite", "resnet", 2.0)] * 4 + [("overwrite", "hc", 3.0)] * 3
    (study / "cells.csv").write_text(
        "task,model,wall_time\n" + "".join(f"{t},{m},{s}\n" for t, m, s in rows)
    )
    return study.parent


def test_the_longest_row_is_the_one_whose_cells_took_longest_in_all(tmp_path):
    assert longest_row(tiny_results(tmp_path) / "tiny" / "cells.csv") == ("overwrite", "hc")


def test_bench_studies_trains_the_longest_group_eager_and_at_the_default(tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", "--parts", "studies", "--results", str(tiny_results(tmp_path))]
    assert main([*argv, "--seeds", "0,1", "--study-runs", "2", "--output", str(out)]) == 0
    [row] = json.loads(out.read_text())["studies"]
    assert (row["study"], row["task"], row["model"]) == ("tiny", "overwrite", "hc")
    assert (row["members"], row["steps"]) == (4, 12)  # 2 seeds × 2 rates, folded
    assert row["eager_status"] == row["default_status"] == ["ok"]
    assert row["x_default"] == pytest.approx(row["eager_s"] / row["default_s"])
    for mode in ("eager", "default"):  # two runs each way, the fastest kept
        assert len(row[f"{mode}_runs_s"]) == 2 and row[f"{mode}_s"] == min(row[f"{mode}_runs_s"])
    assert not row["compiled"]  # 12 steps save less than a compile costs: auto stays eager
    assert row["eager_gflop_per_s"] > 0 and row["matmul_gflop_per_s"] > 0
    assert "×default" in capsys.readouterr().out
    assert len(format_studies_table([row]).splitlines()) == 2


def test_a_study_is_run_at_least_once_each_way(tmp_path):
    with pytest.raises(ValueError, match="at least 1 run"):
        bench_studies(tiny_results(tmp_path), runs=0)


def test_a_study_not_in_the_results_is_named(tmp_path):
    with pytest.raises(ValueError, match="no study 'nope'"):
        bench_studies(tiny_results(tmp_path), studies=["nope"])
