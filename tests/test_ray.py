"""The Ray backend against a real local Ray instance (2 CPUs): the same rows and weights as
the local backend for the same seeds, user task files shipped by content, a lost worker
recorded as failed, and a run that resumes after its driver was killed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

import ddl_dynamics as dd

TASK_FILE = Path(__file__).with_name("custom_tasks.py")
EXPERIMENT = """name = "ray"
seeds = [0, 1]
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = {steps}
n_train = 64
n_test = 32
[[tasks]]
name = "tiny-sum"
[[tasks]]
name = "overwrite"
[[models]]
name = "resnet"
[[models]]
name = "ddl"
"""


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance with 2 CPUs for the module; the runner joins it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def experiment(tmp_path, steps=20):
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.format(steps=steps))
    return path


def rows(run_dir):
    return {r.key: r for r in dd.RunFolder.open(run_dir, "w").store.rows()}


def weights(run_dir, key):
    return torch.load(run_dir / "models" / f"{key}.pt", weights_only=True)


@pytest.mark.slow  # a whole run on a real Ray instance
def test_ray_gives_the_local_backends_rows_and_weights(tmp_path, local_ray):
    exp = experiment(tmp_path)
    local, remote = tmp_path / "local", tmp_path / "ray"
    for run_dir, backend in ((local, "local"), (remote, "ray")):
        summary = dd.run_experiment(
            exp, run_dir, backend=backend, task_files=[TASK_FILE], progress=False
        )
        assert summary.counts == {"ok": 8} and summary.ran == 8
    want, got = rows(local), rows(remote)
    assert set(got) == set(want) and len(got) == 8
    for key, row in got.items():
        assert row.metrics["ensemble"] == 2  # the two seeds of a cell trained together
        assert (row.status, row.metrics["test"], row.curve) == (
            want[key].status,
            want[key].metrics["test"],
            want[key].curve,
        )
        trained, reference = weights(remote, key), weights(local, key)
        assert all(torch.equal(trained[name], reference[name]) for name in reference)
    # the driver kept the task file; the workers got its contents, not a path
    (kept,) = dd.RunFolder.open(remote, "w").store.experiment()["task_files"]
    assert (remote / kept["copy"]).read_bytes() == TASK_FILE.read_bytes()


@pytest.mark.slow  # over 10 s on 2 cores
def test_a_lost_ray_worker_fails_its_cells_and_the_run_goes_on(tmp_path, local_ray):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(steps=5).replace('"overwrite"', '"worker-crash"'))
    summary = dd.run_experiment(
        exp, tmp_path / "run", backend="ray", task_files=[TASK_FILE], progress=False
    )
    assert summary.counts == {"ok": 4, "failed": 4}
    lost = [r for r in rows(tmp_path / "run").values() if r.task == "worker-crash"]
    assert all("the worker process died" in r.message for r in lost) and len(lost) == 4


@pytest.mark.slow  # kills and restarts a Ray driver
def test_a_ray_run_resumes_after_its_driver_is_killed(tmp_path, local_ray):
    exp, run_dir = experiment(tmp_path, steps=300), tmp_path / "run"
    code = (
        "import sys, ddl_dynamics as dd; dd.run_experiment(sys.argv[1], sys.argv[2], "
        "backend='ray', task_files=[sys.argv[3]], progress=False)"
    )
    # its own session, so that its local Ray instance goes down with it
    driver = subprocess.Popen(
        [sys.executable, "-c", code, str(exp), str(run_dir), str(TASK_FILE)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    try:
        while not ((run_dir / "results.sqlite").exists() and rows(run_dir)):
            assert driver.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no cell finished within 240 s"
            time.sleep(0.1)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    stored = {key: (row.created_at, row.metrics) for key, row in rows(run_dir).items()}
    assert 1 <= len(stored) < 8  # killed mid-way
    summary = dd.run_experiment(exp, run_dir, backend="ray", task_files=[TASK_FILE], progress=False)
    assert summary.counts == {"ok": 8} and summary.ran == 8 - len(stored)
    after = rows(run_dir)
    assert {k: (after[k].created_at, after[k].metrics) for k in stored} == stored
    assert all((run_dir / "models" / f"{key}.pt").is_file() for key in after)
