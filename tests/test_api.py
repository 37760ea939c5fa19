"""The public API: small, versioned, usable from a fresh process in any order, reproducible."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment import train as train_module
from ddl_dynamics.models.dopri5 import SolverCapped

ROOT = Path(__file__).resolve().parents[1]


def python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter (nothing imported or registered beforehand)."""
    return subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_the_public_api_is_small_versioned_and_keeps_internals_in_their_modules():
    assert len(dd.__all__) <= 40 and len(set(dd.__all__)) == len(dd.__all__)
    grouped = [name for group in dd.API.values() for names in group.values() for name in names]
    assert sorted(grouped) == dd.__all__
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert dd.__version__ == pyproject["project"]["version"]
    for internal in (
        "generated_update",
        "split_generators",
        "regime_index",
        "parameter_count",
        "Comparison",
        "DeltaProbe",
    ):
        assert not hasattr(dd, internal), internal
    from ddl_dynamics.analysis.judge.comparisons import Comparison

    assert dd.ComparisonSpec is not Comparison  # one class of each name


@pytest.mark.slow  # over 8 s on 2 cores
def test_every_entry_point_works_in_a_fresh_process(tmp_path):
    """No call relies on another having registered the built-ins first: a run straight from
    an ExperimentConfig, then every public name, then the results as one row per cell."""
    done = python(f"""
        import sys
        import ddl_dynamics as dd
        assert "torch" not in sys.modules  # names load on first use
        config = dd.ExperimentConfig(
            name="fresh", seeds=(0, 1),
            tasks=(dd.TaskEntry("parity", "parity"),),
            models=(dd.ModelEntry("resnet", "resnet"), dd.ModelEntry("ddl", "ddl")),
            model_defaults={{"width": 8, "depth": 3, "hidden": 8}},
            train_defaults={{"steps": 4, "n_train": 32, "n_val": 16, "n_test": 16}})
        summary = dd.run_experiment(config, run_dir={str(tmp_path / "run")!r}, progress=False)
        assert summary.ok, summary.counts
        for name in dd.__all__:
            getattr(dd, name)
        rows = dd.load_results({str(tmp_path / "run")!r})
        print(sorted((r["model"], r["seed"], r["status"]) for r in rows))
        assert dd.build_report({str(tmp_path / "run")!r}).tables
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "[('ddl', 0, 'ok'), ('ddl', 1, 'ok'), ('resnet', 0, 'ok'), ('resnet', 1, 'ok')]"
    )


def test_load_results_is_one_row_per_cell_with_a_column_per_figure(tmp_path):
    config = dd.parse_experiment(
        {
            "name": "tidy",
            "seeds": [0, 1],
            "tasks": [{"name": "parity"}],
            "models": [{"name": "ddl", "tune": {"lr": [1e-3, 3e-3]}}],
            "defaults": {
                "model": {"width": 8, "depth": 3, "hidden": 8},
                "train": {"steps": 3, "n_train": 32, "n_val": 16, "n_test": 16},
                "tune": {"extend": 0},
            },
        }
    )  # the declared grid alone
    dd.run_experiment(config, run_dir=tmp_path, progress=False)
    rows = dd.load_results(tmp_path)
    assert len(rows) == 4 and all(list(r) == list(rows[0]) for r in rows)
    assert [(r["seed"], r["lr"]) for r in rows] == [(0, 1e-3), (0, 3e-3), (1, 1e-3), (1, 3e-3)]
    assert sum(r["chosen"] for r in rows) == 2  # the report's grid value, on each seed
    first = rows[0]
    assert (first["task"], first["model"], first["status"], first["metric"]) == (
        "parity",
        "ddl",
        "ok",
        "accuracy",
    )
    assert 0 <= first["test"] <= 1 and "ood/long" in first and first["params"] > 0
    assert {r["key"] for r in rows} == {
        c.key for c in dd.RunFolder.open(tmp_path, "w").store.rows()
    }


def tiny() -> tuple[dd.Task, dd.TrainConfig]:
    return (
        dd.make_task("overwrite", depth=3),
        dd.TrainConfig(steps=20, n_train=64, n_val=32, n_test=32),
    )


def small(name: str, task: dd.Task, **seed: int) -> dd.DepthModel:
    return dd.make_model(
        name,
        in_dim=task.in_dim,
        out_dim=task.out_dim,
        control_dim=task.control_dim,
        width=8,
        depth=3,
        hidden=8,
        **seed,
    )


def test_the_same_seed_gives_the_same_model_and_metrics():
    task, cfg = tiny()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    results = []
    for _ in range(2):
        model = small("ddl", task, seed=0)
        results.append(dd.train(task, model, cfg, seed=0))
    assert torch.equal(torch.get_rng_state(), state)  # the caller's generator is untouched
    assert results[0].metrics["test"] == results[1].metrics["test"]
    assert results[0].curve == results[1].curve
    other = small("ddl", task, seed=1)
    assert dd.train(task, other, cfg, seed=0).metrics["test"] != results[0].metrics["test"]


@pytest.mark.parametrize(
    ("threads", "inside"), [({}, 1), ({"threads": 2}, 2), ({"threads": None}, 3)]
)
def test_train_runs_on_one_thread_unless_told_and_restores_the_callers(
    threads, inside, monkeypatch
):
    seen = []
    real = train_module.train_seeds

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_seeds", spy)
    task, cfg = tiny()
    model = small("resnet", task)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        dd.train(task, model, cfg, seed=0, **threads)
        assert seen == [inside] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # over 10 s on 2 cores
def test_checks_raise_value_errors_even_under_python_O():
    done = python(
        """
        import dataclasses
        import ddl_dynamics as dd
        Switched = type(dd.make_task("switched"))
        Bad = dataclasses.dataclass(frozen=True)(type("Bad", (Switched,), {"knob": "q"}))
        try:
            dd.check_task(Bad())
        except ValueError as err:
            print("task:", err)
        try:
            dd.check_task(Switched)  # the class, not an instance
        except ValueError as err:
            print("class:", err)

        class Unused(dd.make_model("resnet", in_dim=2, out_dim=2).__class__):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.spare = __import__("torch").nn.Linear(2, 2)
        try:
            dd.check_model(Unused(in_dim=2, out_dim=2, width=4, depth=2))
        except ValueError as err:
            print("model:", err)
    """,
        "-O",
    )
    assert done.returncode == 0, done.stderr
    assert "task: Bad.knob 'q' is not a spec field" in done.stdout
    assert "class: check_task takes a Task instance (e.g. MyTask()), not <class" in done.stdout
    assert "model: Unused: no gradient reaches parameter spare.weight" in done.stdout


def test_the_solver_cap_is_its_own_type():
    model = dd.make_model(
        "node",
        in_dim=2,
        out_dim=2,
        width=4,
        depth=2,
        hidden=4,
        max_steps=1,
        rtol=1e-9,
        atol=1e-9,
        seed=0,
    )
    with pytest.raises(SolverCapped, match="max_num_steps"):
        model(torch.randn(4, 2))
    torchdiffeq = dd.make_model(
        "node",
        in_dim=2,
        out_dim=2,
        width=4,
        depth=2,
        hidden=4,
        max_steps=1,
        rtol=1e-9,
        atol=1e-9,
        solver="torchdiffeq",
        seed=0,
    )
    with pytest.raises(SolverCapped, match="max_num_steps"):
        torchdiffeq(torch.randn(4, 2))
