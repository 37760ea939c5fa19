"""The trainer: determinism, what a run records, which split it reads when, and how it ends
(ok, capped, diverged, failed)."""

import dataclasses
import math

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.analysis.judge.verdicts import seed_values
from ddl_dynamics.experiment.config import COUNTED, FINISHED
from ddl_dynamics.experiment.memory import PEAK_MEMORY_MEASURES
from ddl_dynamics.experiment.train import run_cells
from ddl_dynamics.models.dopri5 import SolverCapped

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
        "defaults": {
            "model": TINY,
            "train": {
                "steps": 20,
                "n_train": 128,
                "n_test": 64,
                "batch_size": 32,
                "eval_every": 10,
                **train,
            },
        },
    }
    return dd.expand_cells(dd.parse_experiment(data))[0]


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
    assert 0 <= m["test"] <= 1 and 0 <= m["train"] <= 1 and 0 <= m["val"] <= 1
    assert m["val"] == first.curve[-1][2]  # the curve reads val
    # an untied model cannot run the 4x longer split: recorded with the reason, not dropped
    assert m["ood"] == {"long": None} and "cannot run" in m["skipped"]["long"]
    _, model = cell().build()
    assert first.params == dd.count_parameters(model)
    assert first.flops > 0 and first.wall_time > 0 and first.peak_mem > 0
    assert m["peak_mem_measure"] in PEAK_MEMORY_MEASURES.values()
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
    # 2 · depth · (rtol + atol) at the defaults rtol = atol = 1e-3, depth 3
    assert r.metrics["reconstruction_tolerance"] == pytest.approx(0.012)
    assert r.metrics["reconstruction_flag"] is False


def test_ode_reconstruction_beyond_its_tolerance_is_flagged():
    # one explicit Euler step per depth interval, run forward then backward, is no inverse;
    # at the accuracy the model states (rtol = atol = 1e-8) the round trip fails
    r = fit(
        cell(
            model="node",
            options={"method": "euler", "rtol": 1e-8, "atol": 1e-8},
            steps=4,
            eval_every=2,
            n_test=32,
        )
    )
    m = r.metrics
    assert r.status == "ok" and m["reconstruction_tolerance"] == pytest.approx(1.2e-7)
    assert m["reconstruction_error"] > m["reconstruction_tolerance"]
    assert m["reconstruction_flag"] is True


def test_only_ok_cells_count():
    assert COUNTED == ("ok",)
    assert {"capped", "diverged"} <= set(FINISHED) and "failed" not in FINISHED


def test_time_cap_is_a_failure_that_keeps_partial_results():
    r = fit(cell(max_seconds=1e-9))
    assert r.status == "capped" and "time cap" in r.message and r.status not in COUNTED
    assert r.metrics["steps"] == 1 and r.metrics["test"] is not None and r.curve == []


def test_solver_cap_is_recorded_as_capped():
    r = fit(cell(model="node", ode_max_steps=1, steps=3))
    assert r.status == "capped" and "solver cap" in r.message and r.status not in COUNTED
    assert r.metrics["steps"] == 0


def test_a_cap_on_the_test_data_fails_that_split_alone(monkeypatch):
    """Test data must not steer the grid choice: the cell keeps its status and its val
    metric, and only the test split reads as a failure."""
    c = cell(model="node", steps=2, eval_every=1, n_test=24, n_val=16)
    task, model = c.build()
    solve = type(model)._solve

    def capped_on_test(self, z0, times, u_l):  # the solver gives up on the test batch only
        if not self.training and len(z0) == 24:
            raise SolverCapped("max_num_steps exceeded (test batch)")
        return solve(self, z0, times, u_l)

    monkeypatch.setattr(type(model), "_solve", capped_on_test)
    r = dd.train(task, model, c.train, c.seed)
    assert r.metrics["steps"] == 2 and len(r.curve) == 2 and r.metrics["val"] is not None
    assert r.status == "ok" and "final evaluation" in r.message
    assert r.metrics["test"] is None and "max_num_steps" in r.metrics["capped"]["test"]
    r.seed, r.config = 0, {}
    assert seed_values([r], "test") == {0: None} and seed_values([r], "val") == {
        0: r.metrics["val"]
    }


def scaled_targets(task, split, factor, monkeypatch):
    """Multiply the targets of one split of ``task`` by ``factor``."""
    sample = type(task).sample

    def patched(self, n, seed, name="train"):
        data = sample(self, n, seed, name)
        return dataclasses.replace(data, targets=data.targets * factor) if name == split else data

    monkeypatch.setattr(type(task), "sample", patched)


def test_target_metric_stops_early_on_val():
    r = fit(cell(task="oscillator", model="resnet", target_metric=1e9))
    assert r.status == "ok" and "val metric reached target_metric" in r.message
    assert r.metrics["steps"] == 10 and len(r.curve) == 1


@pytest.mark.parametrize(("split", "stops"), [("val", False), ("test", True)])
def test_early_stop_and_curve_read_val_not_test(monkeypatch, split, stops):
    c = cell(task="oscillator", model="resnet", target_metric=1e3)
    scaled_targets(c.build()[0], split, 1e3, monkeypatch)  # that split's MSE ≈ 1e6 > target
    r = fit(c)
    assert r.metrics["steps"] == (10 if stops else 20)
    assert r.metrics[split] > 1e3 and all(point[2] < 1e3 for point in r.curve) == stops


def test_test_split_is_sampled_and_scored_once(monkeypatch):
    c = cell(steps=30)
    task, model = c.build()
    sample, seen = type(task).sample, []

    def spy(self, n, seed, split="train"):
        seen.append(split)
        return sample(self, n, seed, split)

    monkeypatch.setattr(type(task), "sample", spy)
    forward, scored = type(model).forward, []

    def counting(self, x, *args, **kwargs):
        scored.append(len(x))
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting)
    dd.train(task, model, dataclasses.replace(c.train, n_test=50, n_val=40), c.seed)
    assert seen.count("test") == 1 and seen.count("val") == 1
    assert scored.count(50) == 1 and scored.count(40) == 3 + 1 + 1  # curve, val, train rows


def test_non_finite_loss_diverges(infinite_loss):
    c = cell(task="oscillator", model="resnet")
    infinite_loss(c.build()[0])
    r = fit(c)
    assert r.status == "diverged" and "loss became inf at step 1" in r.message
    assert r.metrics["steps"] == 0 and r.curve == [] and r.status not in COUNTED
    assert r.metrics["test"] is not None  # a failure, still scored where it can be


def test_peak_memory_is_measured_per_cell_in_one_process(monkeypatch):
    c = cell(task="overwrite", model="resnet", steps=2)
    task = c.build()[0]
    small = fit(c)
    sample = type(task).sample

    def hungry(self, n, seed, split="train"):  # touches 400 MB once, then frees it
        torch.ones(100_000_000).sum()
        return sample(self, n, seed, split)

    monkeypatch.setattr(type(task), "sample", hungry)
    big = fit(c)
    monkeypatch.setattr(type(task), "sample", sample)
    after = fit(c)
    if small.metrics["peak_mem_measure"] != PEAK_MEMORY_MEASURES["cell"]:
        pytest.skip("no per-cell peak memory here: " + small.metrics["peak_mem_measure"])
    assert big.peak_mem > small.peak_mem + 300e6
    assert after.peak_mem < big.peak_mem - 300e6


def test_run_cells_turns_exceptions_into_failed_rows(tmp_path, monkeypatch):
    c = cell(task="overwrite")
    other = dataclasses.replace(c, seed=1)

    def broken(*args, **kwargs):
        raise RuntimeError("sampler exploded")

    monkeypatch.setattr(type(c.build()[0]), "sample", broken)
    trained = run_cells([c, other])
    for t, source in zip(trained, [c, other], strict=True):
        r = t.result
        assert r.status == "failed" and "RuntimeError: sampler exploded" in r.message
        assert r.key == source.key and r.config == source.to_dict() and r.model == "ddl"
        assert t.weights is None
    dd.RunFolder.open(tmp_path, "w").save(trained)
    assert not (tmp_path / "models").exists()


def broken_for(task_type, seed, monkeypatch, change):
    """The task's samples for ``seed`` pass through ``change(data, n)`` (or it raises)."""
    sample = task_type.sample

    def patched(self, n, s, split="train"):
        data = sample(self, n, s, split)
        return change(data, n) if s == seed else data

    monkeypatch.setattr(task_type, "sample", patched)


def explode(data, n):
    raise RuntimeError("no data for this seed")


def nan_targets(data, n):
    return dataclasses.replace(data, targets=data.targets.float() * math.nan)


def one_row_short(data, n):
    return data.subset(slice(0, n - 1))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (explode, "RuntimeError: no data for this seed"),
        (nan_targets, "non-finite targets"),
        (one_row_short, "has 127 inputs and 127 targets; 128 were asked for"),
    ],
)
def test_a_task_that_fails_one_seed_fails_that_cell_alone(change, why, monkeypatch):
    cells = [dataclasses.replace(cell(task="overwrite"), seed=s) for s in (0, 1, 2)]
    broken_for(type(cells[0].build()[0]), 1, monkeypatch, change)
    trained = run_cells(cells)
    assert [t.result.status for t in trained] == ["ok", "failed", "ok"]
    assert why in trained[1].result.message and trained[1].weights is None
    assert [t.result.metrics.get("ensemble") for t in trained] == [2, None, 2]
    assert [t.result.seed for t in trained] == [0, 1, 2]
