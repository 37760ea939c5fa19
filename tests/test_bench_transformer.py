"""The Transformer benchmark times the trainer's step of each variant against the first, on a
tiny configuration, and its variants are the Transformer study's rows; the depth study's folded
step is timed eager and compiled."""

import json

import pytest

from ddl_dynamics.bench.folded import bench_folded, format_folded_table
from ddl_dynamics.bench.transformer import (
    EXTRA_VARIANTS,
    STUDY,
    bench_transformer,
    format_transformer_table,
    transformer_variants,
)
from ddl_dynamics.experiment import step as step_module
from ddl_dynamics.experiment.reader import load_experiment


def test_bench_transformer_rows_hold_throughput_ratios_against_the_first_variant():
    variants = {
        "transformer": ("transformer", {}),
        "ddl d_v=2": ("ddl-transformer", {"value_channels": 2}),
    }
    rows = bench_transformer(
        width=8, depth=1, length=6, batch=2, vocab=5, steps=1, repeats=2, variants=variants
    )
    assert [r["variant"] for r in rows] == list(variants)
    first, ddl = rows
    assert first["x_transformer"] == 1.0 and ddl["params"] > first["params"]
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(2 * 6 / (r["ms_per_step"] / 1e3))
    assert ddl["x_transformer"] == pytest.approx(ddl["tokens_per_s"] / first["tokens_per_s"])
    json.dumps(rows)  # rows are plain data
    assert len(format_transformer_table(rows).splitlines()) == 3


@pytest.mark.slow  # over 8 s on 2 cores
def test_the_variants_are_the_transformer_studys_rows_then_the_token_compressor():
    study = load_experiment(STUDY)
    variants = transformer_variants()
    assert list(variants) == [m.label for m in study.models] + list(EXTRA_VARIANTS)
    assert next(iter(variants)) == study.baseline == "transformer"  # the first: the baseline
    for entry in study.models:
        assert variants[entry.label] == (entry.name, entry.options)


TINY_DEPTH_STUDY = """
name = "tiny-depth"
seeds = [0, 1]
baseline = "transformer"
[defaults.model]
depth = 1
heads = 2
qk_norm = true
[defaults.train]
steps = 4
batch_size = 4
n_train = 16
n_val = 8
n_test = 8
[defaults.tune]
lr = [3e-3, 1e-2]
[[tasks]]
name = "var-chain"
label = "var-chain-w8"
spec = { hops = [1, 2] }
model = { width = 8 }
[[models]]
name = "transformer"
[[models]]
name = "ddl-transformer"
label = "ddl-dv2"
value_channels = 2
"""


def test_the_folded_bench_times_each_rows_ensemble_eager_and_compiled(tmp_path, monkeypatch):
    study = tmp_path / "tiny.toml"
    study.write_text(TINY_DEPTH_STUDY)
    # compiled as eager here (compiling takes tens of seconds): the plumbing is under test
    eager_only = step_module._Compiled()
    eager_only.failed = True
    monkeypatch.setattr(step_module, "compiled_losses", eager_only)
    rows = bench_folded(
        widths=(8,), hops=2, variants=("transformer", "ddl-dv2"), study=study, repeats=2
    )
    assert [(r["variant"], r["width"], r["hops"]) for r in rows] == [
        ("transformer", 8, 2),
        ("ddl-dv2", 8, 2),
    ]
    for r in rows:
        assert r["members"] == 4  # 2 seeds × 2 rates, folded
        assert r["x_compiled"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
        assert r["compile_s"] > 0 and r["matmul_gflop_per_s"] > 0
        assert r["eager_gflop_per_s"] > 0 and r["compiled_gflop_per_s"] > 0
    assert len(format_folded_table(rows).splitlines()) == 3
    with pytest.raises(ValueError, match="no cells of row 'ddl-dv4'"):
        bench_folded(widths=(8,), hops=2, variants=("ddl-dv4",), study=study)
