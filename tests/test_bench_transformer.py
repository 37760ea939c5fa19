"""The Transformer benchmark times the trainer's step of each variant against the first, on a
tiny configuration, and its variants are the Transformer study's rows."""

import json

import pytest

from ddl_dynamics.bench.transformer import (
    EXTRA_VARIANTS,
    STUDY,
    bench_transformer,
    format_transformer_table,
    transformer_variants,
)
from ddl_dynamics.experiment.reader import load_experiment


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


def test_the_variants_are_the_transformer_studys_rows_then_the_token_compressor():
    study = load_experiment(STUDY)
    variants = transformer_variants()
    assert list(variants) == [m.label for m in study.models] + list(EXTRA_VARIANTS)
    assert next(iter(variants)) == study.baseline == "transformer"  # the first: the baseline
    for entry in study.models:
        assert variants[entry.label] == (entry.name, entry.options)
