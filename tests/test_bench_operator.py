"""The operator benchmark times the Delta update against an add and the dense operator, on
tiny shapes (timings are not checked)."""

import json

import pytest
import torch

from ddl_dynamics.bench.operator import bench_operator, format_operator_table, traffic_ratio


def test_bench_operator_rows_hold_times_ratios_and_the_dense_comparison():
    threads = torch.get_num_threads()
    rows = bench_operator(
        dims=(8, 32), value_channels=(1, 2), elements=256, repeats=2, dense_elements=512
    )
    assert torch.get_num_threads() == threads  # restored
    assert [(r["d"], r["d_v"], r["tokens"]) for r in rows] == [
        (8, 1, 32),
        (32, 1, 8),
        (8, 2, 32),
        (32, 2, 8),
    ]
    for r in rows:
        for name in ("add", "delta", "reference", "write"):
            assert r[f"{name}_ms"] > 0
            assert r[f"{name}_ns_per_element"] * r["tokens"] * r["d"] * r["d_v"] == (
                pytest.approx(r[f"{name}_ms"] * 1e6)
            )
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
