"""The results store: roundtrip, WAL mode, concurrent writers, run metadata, trained weights."""

import math
import sqlite3
import threading

import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment.train import run_cell


def result(key, status="ok", task="parity", model="ddl", seed=0, test=0.5):
    return dd.RunResult(
        status=status, message=f"msg {key}", key=key, task=task, model=model, seed=seed,
        metrics={"metric": "mse", "test": test, "ood": {"long": None}, "extra": {"e": 1.5}},
        curve=[[10, 0.3, 0.4, 1e6]], params=123, flops=456.0, nfe_forward=12.5,
        nfe_backward=0.0, wall_time=1.25, peak_mem=2**20, config={"seed": seed, "x": [1, 2]},
    )


def test_put_get_roundtrip_and_queries(tmp_path):
    store = dd.ResultStore(tmp_path / "results.sqlite")
    original = result("a", test=float("nan"))
    store.put(original)
    got = store.get("a")
    assert math.isnan(got.metrics.pop("test"))
    original.metrics.pop("test")
    assert {**got.__dict__, "created_at": ""} == original.__dict__
    assert got.created_at
    store.put(result("b", status="failed", model="resnet"))
    store.put(result("c", status="diverged", seed=1))
    store.put(result("d", status="capped", task="overwrite"))
    assert store.done_keys() == {"a", "c", "d"}  # failed cells are not finished: they rerun
    assert [r.key for r in store.rows(task="parity", model="ddl")] == ["a", "c"]
    assert store.get("missing") is None
    store.put(result("b", status="ok", model="resnet"))  # a rerun replaces the row
    assert store.get("b").status == "ok" and len(store.rows()) == 4


def test_wal_mode_and_concurrent_writers(tmp_path):
    path = tmp_path / "results.sqlite"
    dd.ResultStore(path)
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def write(worker):
        store = dd.ResultStore(path)
        for i in range(20):
            store.put(result(f"{worker}-{i}", seed=i))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(dd.ResultStore(path).rows()) == 80


def test_run_metadata(tmp_path):
    store = dd.ResultStore(tmp_path / "r.sqlite")
    assert store.experiment() is None
    run_id = store.start_run("quick", 'name = "quick"', ["/x/tasks.py"])
    meta = store.experiment()
    assert meta["name"] == "quick" and meta["config"] == 'name = "quick"'
    assert meta["task_files"] == ["/x/tasks.py"] and meta["ended_at"] is None
    assert {"python", "torch", "torchdiffeq", "numpy"} <= set(meta["versions"])
    assert meta["machine"]["cpu_count"] >= 1
    store.finish_run(run_id)
    assert store.experiment()["ended_at"] >= meta["started_at"]


def test_load_trained_rebuilds_the_trained_model(tmp_path):
    cfg = dd.ExperimentConfig.from_dict({
        "tasks": [{"name": "parity"}],
        "models": [{"name": "ddl", "beta_init": 0.3}],
        "defaults": {"model": {"width": 8, "depth": 3, "hidden": 8},
                     "train": {"steps": 5, "n_train": 64, "n_test": 32}},
    })
    cell = cfg.cells()[0]
    res = run_cell(cell, tmp_path)
    dd.ResultStore(tmp_path / "results.sqlite").put(res)
    task, model = dd.load_trained(tmp_path, cell.key)
    _, fresh = cell.build()
    data = task.sample(16, 0, "test")
    trained_out = model(data.inputs, data.controls)
    fresh_out = fresh(data.inputs, data.controls)
    assert not model.training and model.beta_init == 0.3
    assert not torch.allclose(trained_out, fresh_out)  # the weights were loaded, not re-initialised
    saved = torch.load(tmp_path / "models" / f"{cell.key}.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
