"""A training step of each vector family, alone and folded, and its cost against members,
width and depth, on tiny configurations (timings are not checked)."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.bench import steps as steps_module
from ddl_dynamics.bench.compiled import bench_compiled, format_compiled_table
from ddl_dynamics.bench.scaling import bench_scaling, format_scaling_table, step_memory
from ddl_dynamics.bench.steps import (
    TrainingStep,
    bench_steps,
    family_step,
    format_steps_table,
)
from ddl_dynamics.experiment import step as step_module
from ddl_dynamics.models import base as models_base
from ddl_dynamics.models.base import MODELS


def test_bench_steps_times_every_vector_family_against_resnet_alone_and_together():
    rows = bench_steps(seeds=(1, 2), width=8, depth=3, batch_size=16, repeats=2)
    families = [f for f in dd.list_models() if MODELS.get(f).kind == "vector"]
    assert [(r["family"], r["seeds"]) for r in rows] == [
        (f, s) for s in (1, 2) for f in ["resnet", *(f for f in families if f != "resnet")]
    ]
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


def test_step_memory_counts_what_the_backward_keeps_and_four_copies_of_the_weights():
    task = dd.make_task("overwrite", depth=3)
    cfg = dd.TrainConfig(batch_size=16)
    sizes = {}
    for depth in (3, 6):
        step = family_step("resnet", task, cfg, 1, 8, depth)
        weights = sum(p.nbytes for p in step.groups[0].module.parameters())
        sizes[depth] = step_memory(step)
        assert sizes[depth] > 4 * weights
    # twice the layers: twice the activations kept (and twice the layers' weights)
    assert sizes[6] > 1.5 * sizes[3]
    assert isinstance(step, TrainingStep) and not step.folded


def test_bench_scaling_times_and_counts_every_family_along_each_axis():
    axes = {"members": (1, 2), "width": (4, 8), "depth": (2, 3)}
    rows = bench_scaling(
        families=["resnet", "ddl", "node"],
        axes=axes,
        base={"width": 4, "depth": 2},
        batch_size=8,
        repeats=1,
    )
    points = [(r["axis"], r["value"], r["family"]) for r in rows]
    assert points == [
        (axis, value, family)
        for axis, values in axes.items()
        for value in values
        for family in ("resnet", "ddl", "node")
    ]
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
    rows = bench_scaling(
        families=["resnet", "node"],
        axes={"members": (1, 2), "depth": (2, 3)},
        base={"width": 4, "depth": 2},
        batch_size=8,
        repeats=1,
    )
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"torch": torch.__version__, "load": "0 0 0", "scaling": rows}))
    script = Path(__file__).parents[1] / "experiments" / "plot_scaling.py"
    image = tmp_path / "scaling.png"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(script), str(bench), str(image)])
        runpy.run_path(str(script), run_name="__main__")
    assert image.read_bytes().startswith(b"\x89PNG")


def test_the_benchmarks_step_is_the_trainers(monkeypatch):
    """Every benchmarked step goes through the one training step the trainer takes."""
    calls = []
    real = step_module.training_step

    def spy(ensemble, *args, **kwargs):
        calls.append(ensemble.size)
        return real(ensemble, *args, **kwargs)

    monkeypatch.setattr(steps_module, "training_step", spy)
    task, cfg = dd.make_task("overwrite", depth=3), dd.TrainConfig(batch_size=8)
    folded = family_step("ddl", task, cfg, 3, 8, 3)
    folded.run()
    assert calls == [3]
    losses = folded.run_group(0)
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    assert folded.folded and len(folded.optimizers) == 1
    torch.testing.assert_close(
        folded.batches[0].inputs[:8].to(torch.float32),
        task.sample(8, 0, "train").inputs.to(torch.float32),
    )


def test_the_compile_bench_times_each_family_eager_and_compiled_beside_its_stored_gain(
    monkeypatch,
):
    # compiled as eager here (compiling takes tens of seconds): the plumbing is under test
    eager_only = step_module._Compiled()
    eager_only.failed = True
    monkeypatch.setattr(step_module, "compiled_losses", eager_only)
    rows = bench_compiled(families=("resnet", "ddl"), members=2, width=8, depth=2, repeats=2)
    assert [r["family"] for r in rows] == ["resnet", "ddl"]
    for r in rows:
        assert r["members"] == 2 and r["compile_s"] > 0
        assert r["x_compiled"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
        assert r["compile_gain"] == models_base.family(r["family"]).compile_gain
    assert rows[1]["compile_gain"] == 1.0  # the Delta stack: never compiled by "auto"
    assert len(format_compiled_table(rows).splitlines()) == 3
