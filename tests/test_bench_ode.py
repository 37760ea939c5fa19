"""Where a neural ODE's training step goes, on a tiny configuration (timings are not
checked)."""

import json

import pytest

from ddl_dynamics.bench.ode import bench_ode, format_ode_table


def test_bench_ode_splits_a_step_into_the_fields_evaluations_and_the_rest():
    rows = bench_ode(members=(1, 2), width=8, depth=3, batch_size=16, repeats=2)
    assert [(r["solver"], r["members"]) for r in rows] == [
        ("torchdiffeq", 1),
        ("auto", 1),
        ("auto", 2),
    ]
    for r in rows:
        assert r["nfe_forward"] >= 3 * 7 and r["nfe_backward"] == 0  # ≥ one step per depth step
        assert r["step_ms"] == pytest.approx(r["forward_ms"] + r["backward_ms"])
        assert r["field_ms"] == pytest.approx(
            r["nfe_forward"] * r["eval_forward_backward_us"] / 1e3
        )
        assert r["solver_ms"] == pytest.approx(r["step_ms"] - r["field_ms"])
    # the two solvers take the same steps on the same member
    assert rows[0]["nfe_forward"] == rows[1]["nfe_forward"]
    json.dumps(rows)
    assert len(format_ode_table(rows).splitlines()) == 1 + len(rows)
