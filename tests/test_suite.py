"""The runner: every cell once, resume after a kill, and one bad cell never stops the suite;
failed cells retried on request; several runs split one experiment; no orphan processes."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.train import stamp


def experiment(tasks, models=("resnet", "ddl"), steps=10, **defaults):
    return dd.parse_experiment(
        {
            "name": "t",
            "tasks": [{"name": t} for t in tasks],
            "models": [{"name": m} for m in models],
            "defaults": {
                "model": {"width": 8, "depth": 3, "hidden": 8},
                "train": {"steps": steps, "n_train": 64, "n_test": 32, **defaults},
            },
        }
    )


def snapshot(run_dir):
    rows = dd.RunFolder.open(run_dir, "w").store.rows()
    return {r.key: (r.created_at, r.metrics) for r in rows}


def test_runs_every_cell_once_then_skips_finished(tmp_path):
    cfg = experiment(["parity", "overwrite"])
    summary = dd.run_experiment(cfg, tmp_path, progress=False)
    assert summary.counts == {"ok": 4} and summary.ran == 4 and summary.ok
    keys = {c.key for c in dd.expand_cells(cfg)}
    assert set(snapshot(tmp_path)) == keys
    assert {p.stem for p in (tmp_path / "models").glob("*.pt")} == keys
    before = snapshot(tmp_path)
    again = dd.run_experiment(cfg, tmp_path, progress=False)
    assert (again.ran, again.skipped) == (0, 4) and snapshot(tmp_path) == before
    assert dd.RunFolder.open(tmp_path, "w").store.experiment()["ended_at"]


def test_seeds_of_a_cell_train_together_unless_told_not_to(tmp_path, capsys):
    cfg = experiment(["overwrite"], models=["ddl"])
    dd.run_experiment(cfg, tmp_path / "v", seeds=[1], progress=False)
    summary = dd.run_experiment(cfg, tmp_path / "v", seeds=[0, 1, 2], progress=False)
    assert (summary.ran, summary.skipped) == (2, 1)  # seeds 0 and 2, together
    together = {r.seed: r for r in dd.RunFolder.open(tmp_path / "v", "w").store.rows()}
    assert {s: r.metrics["ensemble"] for s, r in together.items()} == {0: 2, 1: 1, 2: 2}
    apart = dd.run_experiment(cfg, tmp_path / "n", seeds=[0, 1, 2], vectorize=False, progress=False)
    assert apart.ran == 3
    alone = {r.seed: r for r in dd.RunFolder.open(tmp_path / "n", "w").store.rows()}
    assert {s: r.metrics["ensemble"] for s, r in alone.items()} == {0: 1, 1: 1, 2: 1}
    for seed, row in together.items():
        assert row.key == alone[seed].key  # the same cells, whichever way they ran
        assert row.metrics["test"] == pytest.approx(alone[seed].metrics["test"], rel=1e-4)


def test_failed_cells_rerun(tmp_path):
    cfg = experiment(["overwrite"], models=["resnet"])
    cell = dd.expand_cells(cfg)[0]
    dd.RunFolder.open(tmp_path, "w").store.put(
        stamp(dd.RunResult(status="failed", message="boom"), cell)
    )
    summary = dd.run_experiment(cfg, tmp_path, progress=False)
    assert summary.ran == 1 and summary.counts == {"ok": 1}


def test_diverged_cell_is_recorded_and_the_suite_goes_on(tmp_path, infinite_loss):
    cfg = experiment(["oscillator", "overwrite"], models=["resnet"])
    infinite_loss(dd.make_task("oscillator"))
    summary = dd.run_experiment(cfg, tmp_path, progress=False)
    assert summary.counts == {"ok": 1, "diverged": 1} and not summary.ok
    rows = {r.task: r for r in dd.RunFolder.open(tmp_path, "w").store.rows()}
    assert rows["oscillator"].status == "diverged"
    assert "loss became inf" in rows["oscillator"].message
    assert rows["overwrite"].status == "ok"


def test_capped_cells_are_failures_of_the_run(tmp_path):
    summary = dd.run_experiment(
        experiment(["overwrite"], models=["resnet"], max_seconds=1e-9), tmp_path, progress=False
    )
    assert summary.counts == {"capped": 1} and not summary.ok


def test_retry_failed_trains_again_only_the_diverged_capped_and_failed_cells(
    tmp_path, monkeypatch, infinite_loss
):
    cfg = experiment(["oscillator", "overwrite", "parity"], models=["resnet"])
    infinite_loss(dd.make_task("oscillator"))
    assert dd.run_experiment(cfg, tmp_path, progress=False).counts == {"ok": 2, "diverged": 1}
    monkeypatch.undo()  # the cause is fixed
    store = dd.RunFolder.open(tmp_path, "w").store
    parity = next(c for c in dd.expand_cells(cfg) if c.task == "parity")
    store.put(stamp(dd.RunResult(status="capped", message="time cap"), parity))
    assert dd.run_experiment(cfg, tmp_path, progress=False).ran == 0  # labels are kept...
    before = snapshot(tmp_path)
    summary = dd.run_experiment(cfg, tmp_path, progress=False, retry_failed=True)  # ...until
    assert (summary.ran, summary.skipped, summary.counts) == (2, 1, {"ok": 3})
    after = snapshot(tmp_path)
    overwrite = next(c.key for c in dd.expand_cells(cfg) if c.task == "overwrite")
    assert after[overwrite] == before[overwrite]  # the ok cell was not trained again
    assert all(after[k] != before[k] for k in after if k != overwrite)


def test_retry_failed_from_the_cli(tmp_path, capsys, infinite_loss, monkeypatch):
    exp = tmp_path / "exp.toml"
    exp.write_text(
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
        "[defaults.model]\nwidth = 8\ndepth = 3\nhidden = 8\n"
        "[defaults.train]\nsteps = 10\nn_train = 64\nn_test = 32\n"
    )
    argv = ["run", str(exp), "--run-dir", str(tmp_path / "run")]
    infinite_loss(dd.make_task("overwrite"))
    assert main(argv) == 1
    monkeypatch.undo()
    assert main(argv) == 1 and "1 diverged (0 trained, 1 already done)" in capsys.readouterr().out
    assert main([*argv, "--retry", "failed"]) == 0
    assert "1 ok (1 trained, 0 already done)" in capsys.readouterr().out


def test_a_finite_blow_up_is_diverged_not_ok(tmp_path):
    cfg = experiment(["overwrite"], models=["resnet"], steps=100, lr=1e6, grad_clip=0)
    assert dd.run_experiment(cfg, tmp_path, progress=False).counts == {"diverged": 1}
    (row,) = dd.RunFolder.open(tmp_path, "w").store.rows()
    value = float(re.search(r"loss became (\S+) at step", row.message).group(1))
    assert value < float("inf") and "first step" in row.message


def run_cli(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "ddl_dynamics.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # over 10 s on 2 cores
def test_two_concurrent_runs_train_each_cell_once_in_total(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "split"\nseeds = [0, 1, 2, 3]\n[defaults.model]\nwidth = 16\n'
        "depth = 4\n[defaults.train]\nsteps = 150\nn_train = 256\nn_test = 64\n"
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
    )
    runs = [run_cli("run", config, "--run-dir", tmp_path / "run") for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    trained = []
    for out, _ in outputs:  # each run waits for the other's cells, so both see all four
        line = re.search(
            r"split: 4 ok \((\d+) trained, (\d+) already done(, \d+ by other "
            r"runs)?\)",
            out,
        )
        assert line, out
        trained.append(int(line.group(1)))
    assert sum(trained) == 4, trained
    with sqlite3.connect(tmp_path / "run" / "results.sqlite") as con:  # one result per cell
        assert con.execute("SELECT generation FROM claims").fetchall() == [(1,)] * 4
        assert con.execute("SELECT owner FROM claims WHERE owner IS NOT NULL").fetchall() == []


def descendants(pid):
    """Process ids under ``pid``, read from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # over 10 s on 2 cores
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_killing_the_parent_of_a_pool_run_leaves_no_process(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "orphans"\nseeds = [0, 1, 2, 3]\n[defaults.model]\nwidth = 16\n'
        'depth = 4\n[defaults.train]\nsteps = 100000\n[[tasks]]\nname = "overwrite"\n'
        '[[models]]\nname = "resnet"\n'
    )
    run = run_cli("run", config, "--run-dir", tmp_path / "run", "--jobs", "2")
    deadline, children = time.monotonic() + 120, []
    try:
        while (
            not list((tmp_path / "run").glob("results.sqlite"))
            or len(children := descendants(run.pid)) < 3
        ):  # workers (and forkserver, tracker)
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no worker started within 120 s"
            time.sleep(0.2)
        time.sleep(2)  # the workers are training
        children = descendants(run.pid)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 10
        while (alive := [pid for pid in children if running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, f"{len(alive)} of {len(children)} processes outlived their parent"
    finally:  # whatever happened, leave nothing behind
        for pid in [run.pid, *children]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_killed_run_resumes_without_losing_finished_cells(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "kill"\nseeds = [0, 1]\n[defaults.model]\nwidth = 16\ndepth = 4\n'
        "[defaults.train]\nsteps = 150\nn_train = 256\nn_test = 64\n"
        '[[tasks]]\nname = "parity"\n[[models]]\nname = "resnet"\n[[models]]\nname = "ddl"\n'
    )
    run_dir = tmp_path / "run"
    code = (
        "import sys, ddl_dynamics as dd; "
        "dd.run_experiment(sys.argv[1], run_dir=sys.argv[2], progress=False)"
    )
    worker = subprocess.Popen([sys.executable, "-c", code, str(config), str(run_dir)])
    store, deadline = run_dir / "results.sqlite", time.monotonic() + 120
    try:
        while not (store.exists() and snapshot(run_dir)):
            assert worker.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no cell finished within 120 s"
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    stored = snapshot(run_dir)
    assert 1 <= len(stored) < 4  # killed mid-way
    summary = dd.run_experiment(config, run_dir=run_dir, progress=False)
    assert summary.counts == {"ok": 4} and summary.ran == 4 - len(stored)
    after = snapshot(run_dir)
    assert {k: after[k] for k in stored} == stored  # earlier rows untouched


def test_bad_arguments_fail_before_anything_runs(tmp_path):
    cfg = experiment(["overwrite"])
    with pytest.raises(ValueError, match="unknown backend"):
        dd.run_experiment(cfg, tmp_path, backend="slurm")
    with pytest.raises(ValueError, match="Did you mean 'resnet'"):
        dd.run_experiment(cfg, tmp_path, only={"model": ["resnt"]})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            dd.run_experiment(cfg, tmp_path, device="cuda")
    assert not (tmp_path / "results.sqlite").exists()


def test_ray_backend_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ImportError, match="pip install ray"):
        dd.run_experiment(experiment(["overwrite"]), tmp_path, backend="ray")
