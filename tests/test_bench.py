"""The benchmarks measure what they say, on tiny configurations (timings are not checked),
and ``ddl-dyn bench`` prints their tables and writes their rows as JSON."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.bench import (
    TrainingStep,
    _training_step,
    bench_ode,
    bench_operator,
    bench_scaling,
    bench_steps,
    bench_suite,
    bench_transformer,
    format_ode_table,
    format_operator_table,
    format_scaling_table,
    format_steps_table,
    format_suite_table,
    format_transformer_table,
    step_memory,
    traffic_ratio,
)
from ddl_dynamics.models.base import MODELS


def test_bench_operator_rows_hold_times_ratios_and_the_dense_comparison():
    threads = torch.get_num_threads()
    rows = bench_operator(dims=(8, 32), value_channels=(1, 2), elements=256, repeats=2,
                          dense_elements=512)
    assert torch.get_num_threads() == threads  # restored
    assert [(r["d"], r["d_v"], r["tokens"]) for r in rows] == [
        (8, 1, 32), (32, 1, 8), (8, 2, 32), (32, 2, 8)]
    for r in rows:
        for name in ("add", "delta", "reference", "write"):
            assert r[f"{name}_ms"] > 0
            assert r[f"{name}_ns_per_element"] * r["tokens"] * r["d"] * r["d_v"] == (
                pytest.approx(r[f"{name}_ms"] * 1e6))
        assert r["delta_x_add"] == pytest.approx(r["delta_ms"] / r["add_ms"])
        assert r["traffic_x_add"] == traffic_ratio(r["d_v"])
        assert r["backend"] in ("cpu", "reference")
    # the dense operator only on the tokens whose d × d fit in dense_elements: 512 // 64 = 8
    assert rows[0]["dense_tokens"] == 8 and "dense_tokens" not in rows[1]
    json.dumps(rows)  # rows are plain data
    table = format_operator_table(rows).splitlines()
    assert len(table) == 1 + len(rows) and "delta×add" in table[0]


def test_traffic_ratio_counts_reads_and_writes():
    # add 3S; update 5S + 3K with K = S/d_v; accumulating adds 6S and 3S + 3K.
    assert traffic_ratio(1) == 8 / 3 and traffic_ratio(4) == (5 + 0.75) / 3
    assert traffic_ratio(1, accumulate=True) == 14 / 9


def test_bench_transformer_rows_hold_throughput_ratios_against_the_first_variant():
    variants = {"transformer": ("transformer", {}),
                "ddl d_v=2": ("ddl-transformer", {"value_channels": 2})}
    rows = bench_transformer(width=8, depth=1, length=6, batch=2, vocab=5, steps=1, repeats=2,
                             variants=variants)
    assert [r["variant"] for r in rows] == list(variants)
    first, ddl = rows
    assert first["x_transformer"] == 1.0 and ddl["params"] > first["params"]
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(2 * 6 / (r["ms_per_step"] / 1e3))
    assert ddl["x_transformer"] == pytest.approx(ddl["tokens_per_s"] / first["tokens_per_s"])
    json.dumps(rows)  # rows are plain data
    assert len(format_transformer_table(rows).splitlines()) == 3


def test_bench_steps_times_every_vector_family_against_resnet_alone_and_together():
    rows = bench_steps(seeds=(1, 2), width=8, depth=3, batch_size=16, repeats=2)
    families = [f for f in dd.list_models() if MODELS.get(f).kind == "vector"]
    assert [(r["family"], r["seeds"]) for r in rows] == [
        (f, s) for s in (1, 2) for f in ["resnet", *(f for f in families if f != "resnet")]]
    by = {(r["family"], r["seeds"]): r for r in rows}
    assert by["resnet", 1]["x_baseline"] == by["resnet", 2]["x_baseline"] == 1.0
    for family in families:
        one, two = by[family, 1], by[family, 2]
        assert one["ms"] > 0 and two["ms"] > 0 and not one["folded"]
        assert two["x_baseline"] == pytest.approx(two["ms"] / by["resnet", 2]["ms"])
        assert two["x_one_by_one"] == pytest.approx(two["ms"] / (2 * one["ms"]))
    # every family folds, the adaptive ODEs too (each member its own step-size control)
    assert {f for f in families if by[f, 2]["folded"]} == set(families)
    assert len(format_steps_table(rows).splitlines()) == 1 + len(rows)


def test_bench_ode_splits_a_step_into_the_fields_evaluations_and_the_rest():
    rows = bench_ode(members=(1, 2), width=8, depth=3, batch_size=16, repeats=2)
    assert [(r["solver"], r["members"]) for r in rows] == [
        ("torchdiffeq", 1), ("auto", 1), ("auto", 2)]
    for r in rows:
        assert r["nfe_forward"] >= 3 * 7 and r["nfe_backward"] == 0  # ≥ one step per depth step
        assert r["step_ms"] == pytest.approx(r["forward_ms"] + r["backward_ms"])
        assert r["field_ms"] == pytest.approx(r["nfe_forward"] * r["eval_forward_backward_us"]
                                              / 1e3)
        assert r["solver_ms"] == pytest.approx(r["step_ms"] - r["field_ms"])
    # the two solvers take the same steps on the same member
    assert rows[0]["nfe_forward"] == rows[1]["nfe_forward"]
    json.dumps(rows)
    assert len(format_ode_table(rows).splitlines()) == 1 + len(rows)


def test_step_memory_counts_what_the_backward_keeps_and_four_copies_of_the_weights():
    task = dd.make_task("overwrite", depth=3)
    cfg = dd.TrainConfig(batch_size=16)
    sizes = {}
    for depth in (3, 6):
        step = _training_step("resnet", task, cfg, 1, 8, depth)
        weights = sum(p.nbytes for p in step.groups[0].module.parameters())
        sizes[depth] = step_memory(step)
        assert sizes[depth] > 4 * weights
    # twice the layers: twice the activations kept (and twice the layers' weights)
    assert sizes[6] > 1.5 * sizes[3]
    assert isinstance(step, TrainingStep) and not step.folded


def test_bench_scaling_times_and_counts_every_family_along_each_axis():
    axes = {"members": (1, 2), "width": (4, 8), "depth": (2, 3)}
    rows = bench_scaling(families=["resnet", "ddl", "node"], axes=axes,
                         base={"width": 4, "depth": 2}, batch_size=8, repeats=1)
    points = [(r["axis"], r["value"], r["family"]) for r in rows]
    assert points == [(axis, value, family) for axis, values in axes.items()
                      for value in values for family in ("resnet", "ddl", "node")]
    for r in rows:
        assert r[r["axis"]] == r["value"] and r["ms"] > 0 and r["bytes"] > 0
        assert r["folded"] == (r["members"] > 1)
        if r["family"] == "resnet":
            assert r["x_baseline"] == r["memory_x_baseline"] == 1.0
    by = {(r["axis"], r["value"], r["family"]): r for r in rows}
    for family in ("resnet", "ddl", "node"):  # memory grows along every axis
        for axis, (small, large) in axes.items():
            assert by[axis, large, family]["bytes"] > by[axis, small, family]["bytes"]
    json.dumps(rows)
    assert len(format_scaling_table(rows).splitlines()) == 1 + len(rows)


def test_the_scaling_figure_draws_the_bench_json(tmp_path):
    """``experiments/plot_scaling.py`` turns a bench JSON's scaling rows into an image."""
    rows = bench_scaling(families=["resnet", "node"], axes={"members": (1, 2), "depth": (2, 3)},
                         base={"width": 4, "depth": 2}, batch_size=8, repeats=1)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"torch": torch.__version__, "load": "0 0 0", "scaling": rows}))
    script = Path(__file__).parents[1] / "experiments" / "plot_scaling.py"
    image = tmp_path / "scaling.png"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(script), str(bench), str(image)])
        runpy.run_path(str(script), run_name="__main__")
    assert image.read_bytes().startswith(b"\x89PNG")


def tiny_experiment(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('name = "b"\nseeds = [0, 1]\n[defaults.model]\nwidth = 8\ndepth = 3\n'
                    '[defaults.train]\nsteps = 5\nn_train = 32\nn_test = 16\n'
                    '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
                    '[[models]]\nname = "ddl"\n')
    return path


@pytest.mark.slow  # trains a suite once per setting
def test_bench_suite_runs_the_experiment_once_per_setting(tmp_path):
    rows = bench_suite(tiny_experiment(tmp_path), only={"model": ["ddl"]})
    assert [(r["vectorize"], r["jobs"]) for r in rows] == [
        (False, 1), (True, 1), (False, 2), (True, 2)]
    for r in rows:
        assert r["counts"] == {"ok": 2} and r["cells"] == 2 and r["wall_s"] > 0
        assert r["x_first"] == pytest.approx(r["wall_s"] / rows[0]["wall_s"])
    assert len(format_suite_table(rows).splitlines()) == 5
    assert not list(tmp_path.glob("runs*"))  # every run in its own temporary folder


def test_bench_command_prints_tables_and_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", "--parts", "suite,cuda", "--experiment", str(tiny_experiment(tmp_path)),
            "--only", "model=resnet", "--seeds", "0", "--output", str(out)]
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
