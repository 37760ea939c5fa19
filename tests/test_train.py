"""The trainer: determinism, what a run records, and how it ends (ok, capped, diverged, failed)."""

import math

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment.train import _lr_factor, run_cell

TINY = {"width": 8, "depth": 3, "hidden": 8}


@pytest.fixture(autouse=True)
def one_thread():
    """Train as the runner does, on one thread: tiny models are far faster so."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cell(task="parity", model="ddl", spec=None, options=None, **train):
    data = {
        "tasks": [{"name": task, "spec": spec or {}}],
        "models": [{"name": model, **(options or {})}],
        "defaults": {"model": TINY, "train": {"steps": 20, "n_train": 128, "n_test": 64,
                                              "batch_size": 32, "eval_every": 10, **train}},
    }
    return dd.ExperimentConfig.from_dict(data).cells()[0]


def fit(c):
    task, model = c.build()
    return dd.train(task, model, c.train, c.seed)


def test_run_records_metrics_costs_and_is_deterministic():
    first, again = fit(cell()), fit(cell())
    assert first.status == "ok" and first.message == ""
    assert first.curve == again.curve and first.metrics == again.metrics
    assert [point[0] for point in first.curve] == [10, 20]
    assert first.curve[1][3] == pytest.approx(2 * first.curve[0][3])  # cumulative FLOPs
    m = first.metrics
    assert m["metric"] == "accuracy" and m["higher_is_better"] and m["steps"] == 20
    assert 0 <= m["test"] <= 1 and 0 <= m["train"] <= 1
    assert m["test"] == first.curve[-1][2]
    # an untied model cannot run the 4x longer split: recorded with the reason, not dropped
    assert m["ood"] == {"long": None} and "cannot run" in m["skipped"]["long"]
    _, model = cell().build()
    assert first.params == dd.count_parameters(model)
    assert first.flops > 0 and first.wall_time > 0 and first.peak_mem > 0
    assert first.nfe_forward is None
    assert fit(cell(model="resnet")).metrics != m


def test_tied_model_runs_ood_split_and_task_extras():
    r = fit(cell(task="oscillator", model="ddl", options={"tied": True}))
    assert r.status == "ok"
    assert math.isfinite(r.metrics["ood"]["long"]) and not r.metrics["skipped"]
    assert "energy_drift" in r.metrics["extra"] and "long/energy_drift" in r.metrics["extra"]


def test_ode_run_records_nfe_and_reconstruction():
    r = fit(cell(model="node", steps=4, eval_every=2, n_test=32))
    assert r.status == "ok"
    assert r.nfe_forward > 0 and r.nfe_backward == 0  # no adjoint: backprop through the solver
    assert r.metrics["nfe_test"] > 0 and r.metrics["reconstruction_error"] >= 0
    assert math.isfinite(r.metrics["ood"]["long"])  # an ODE runs any horizon


def test_time_cap_keeps_partial_results():
    r = fit(cell(max_seconds=1e-9))
    assert r.status == "capped" and "time cap" in r.message
    assert r.metrics["steps"] == 1 and r.metrics["test"] is not None and r.curve == []


def test_solver_cap_is_recorded_as_capped():
    r = fit(cell(model="node", ode_max_steps=1, steps=3))
    assert r.status == "capped" and "solver cap" in r.message
    assert r.metrics["steps"] == 0


def test_target_metric_stops_early():
    r = fit(cell(task="oscillator", model="resnet", target_metric=1e9))
    assert r.status == "ok" and "reached target_metric" in r.message
    assert r.metrics["steps"] == 10 and len(r.curve) == 1


def test_non_finite_loss_diverges(infinite_loss):
    c = cell(task="oscillator", model="resnet")
    infinite_loss(c.build()[0])
    r = fit(c)
    assert r.status == "diverged" and "loss became inf at step 1" in r.message
    assert r.metrics["steps"] == 0 and r.curve == []


def test_run_cell_turns_exceptions_into_failed_rows(tmp_path, monkeypatch):
    c = cell(task="overwrite")

    def broken(*args, **kwargs):
        raise RuntimeError("sampler exploded")

    monkeypatch.setattr(type(c.build()[0]), "sample", broken)
    r = run_cell(c, tmp_path)
    assert r.status == "failed" and "RuntimeError: sampler exploded" in r.message
    assert r.key == c.key and r.config == c.to_dict() and r.model == "ddl"
    assert not (tmp_path / "models").exists()


def test_schedule_warms_up_then_decays_to_zero():
    factor = _lr_factor(dd.TrainConfig(steps=100, warmup=0.1))
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0) and factor(100) == pytest.approx(0.0)
    assert all(factor(s) >= factor(s + 1) for s in range(10, 100))
    assert _lr_factor(dd.TrainConfig(steps=100, warmup=20))(19) == pytest.approx(1.0)
