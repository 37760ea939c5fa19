"""The run folder: opened once, it saves trained cells, rebuilds their models, keeps the
run's task files and its probes (each file read once), and writes every file atomically."""

import hashlib
from collections import Counter

import numpy as np
import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.analysis.render.formats import render
from ddl_dynamics.analysis.render.html import write_html_report
from ddl_dynamics.analysis.report.build import build_report
from ddl_dynamics.experiment import store as store_module
from ddl_dynamics.experiment.folder import RunFolder
from ddl_dynamics.experiment.train import run_cells

#: A small run: 2 models (one with gates to probe), 1 task, 2 seeds, a few steps.
SMALL = {
    "name": "small",
    "seeds": [0, 1],
    "tasks": [{"name": "overwrite"}],
    "models": [{"name": "ddl"}, {"name": "resnet"}],
    "defaults": {
        "model": {"width": 8, "depth": 3, "hidden": 8},
        "train": {"steps": 4, "eval_every": 2, "n_train": 32, "n_test": 16},
    },
}


def small_run(run_dir):
    summary = dd.run_experiment(dd.parse_experiment(SMALL), run_dir, progress=False)
    assert summary.counts == {"ok": 4}
    return run_dir


def test_a_run_and_its_html_report_open_the_store_once_each_and_read_each_probe_once(
    tmp_path, monkeypatch
):
    """The run saves every cell through its one store; the report reads the run folder
    through one store and each probe file at most once, however many tables and figures
    read the probe (a second report, on the probes the first one kept, reads each once)."""
    opened: list[object] = []
    loads: Counter[str] = Counter()
    open_store, load = store_module.ResultStore.__init__, np.load

    def spy_open(self, *args, **kwargs):
        opened.append(args[0])
        open_store(self, *args, **kwargs)

    def spy_load(file, *args, **kwargs):
        loads[str(file)] += 1
        return load(file, *args, **kwargs)

    monkeypatch.setattr(store_module.ResultStore, "__init__", spy_open)
    monkeypatch.setattr(np, "load", spy_load)
    run_dir = small_run(tmp_path / "run")
    assert len(opened) == 1  # the run: once, not once per finished cell
    write_html_report(run_dir, tmp_path / "first.html")
    assert len(opened) == 2  # the report: once, not once per cell it probes
    assert not loads  # the probes it made are kept, not read back
    probes = sorted((run_dir / "probes").glob("*.npz"))
    assert len(probes) == 4
    loads.clear()
    write_html_report(run_dir, tmp_path / "second.html")
    assert len(opened) == 3
    assert loads == {str(p): 1 for p in probes}


def test_the_markdown_regime_table_does_not_depend_on_the_probes_kept(tmp_path):
    """The report probes the gated stacks it shows: the same table from a run folder with
    no probes kept as from one whose every probe was made by the HTML report."""
    run_dir = small_run(tmp_path / "run")
    assert not (run_dir / "probes").exists() or not any((run_dir / "probes").iterdir())
    report = build_report(run_dir)
    assert [(r.task, r.model) for r in report.regimes] == [("overwrite", "ddl")]
    before = render(report, "md")
    assert "## Gate regimes used by the trained Delta stacks" in before
    write_html_report(run_dir, tmp_path / "report.html")
    assert render(build_report(run_dir), "md") == before


def test_read_mode_refuses_a_missing_folder_and_write_mode_creates_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'run'}: no such run folder$"):
        RunFolder.open(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    RunFolder.open(tmp_path / "run", "w")
    assert RunFolder.open(tmp_path / "run").store.rows() == []
    with pytest.raises(ValueError, match="unknown run folder mode 'a'"):
        RunFolder.open(tmp_path / "run", "a")  # type: ignore[arg-type]


def test_a_saved_cell_rebuilds_its_trained_model(tmp_path):
    cfg = dd.parse_experiment(
        {
            "tasks": [{"name": "parity"}],
            "models": [{"name": "ddl", "beta_init": 0.3}],
            "defaults": {
                "model": {"width": 8, "depth": 3, "hidden": 8},
                "train": {"steps": 5, "n_train": 64, "n_test": 32},
            },
        }
    )
    cell = dd.expand_cells(cfg)[0]
    trained = run_cells([cell])
    folder = RunFolder.open(tmp_path, "w")
    folder.save(trained)
    assert folder.store.get(cell.key).status == trained[0].result.status == "ok"
    task, model = RunFolder.open(tmp_path).load_model(cell.key)
    _, fresh = cell.build()
    data = task.sample(16, 0, "test")
    trained_out = model(data.inputs, data.controls)
    fresh_out = fresh(data.inputs, data.controls)
    assert not model.training and model.beta_init == 0.3
    assert not torch.allclose(trained_out, fresh_out)  # the weights were loaded, not re-initialised
    saved = torch.load(tmp_path / "models" / f"{cell.key}.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert not list((tmp_path / "models").glob("*.tmp"))  # written beside, renamed into place
    with pytest.raises(ValueError, match="no trained model for cell 'elsewhere'"):
        folder.load_model("elsewhere")


def test_each_probe_file_is_read_once_and_a_probe_put_is_written_and_kept(tmp_path, monkeypatch):
    folder = RunFolder.open(tmp_path, "w")
    assert folder.probe("k") is None  # not probed yet
    arrays = {"beta": np.arange(6.0).reshape(2, 3)}
    folder.put_probe("k", arrays)
    assert folder.probe("k") is arrays  # kept: not read back
    reads: list[str] = []
    load = np.load
    monkeypatch.setattr(
        np, "load", lambda file, *a, **k: reads.append(str(file)) or load(file, *a, **k)
    )
    again = RunFolder.open(tmp_path)
    for _ in range(3):
        assert np.array_equal(again.probe("k")["beta"], arrays["beta"])
    assert reads == [str(folder.probe_path("k"))]
    folder.probe_path("cut").write_bytes(folder.probe_path("k").read_bytes()[:20])
    assert again.probe("cut") is None  # cut short: not yet probed


KEPT_TASK = """
from dataclasses import dataclass

import torch

from ddl_dynamics import Task, TaskData, register_task


@register_task("kept-sum")
@dataclass(frozen=True)
class KeptSum(Task):
    in_dim = 2
    out_dim = 1

    def sample(self, n, seed, split="train"):
        x = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))
        return TaskData(x, x.sum(-1, keepdim=True), self.depth)
"""


def test_kept_task_files_are_copied_hashed_and_imported_once(tmp_path):
    source = tmp_path / "extra_tasks.py"
    source.write_text(KEPT_TASK)
    folder = RunFolder.open(tmp_path / "run", "w")
    (record,) = folder.keep_task_files([source])
    copy = tmp_path / "run" / record["copy"]
    assert copy.read_text() == source.read_text()
    assert record["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert record["sha256"][:12] in copy.name and record["file"] == str(source)
    assert record["registers"] == ["task:kept-sum"] and "kept-sum" in dd.list_tasks()
    assert folder.keep_task_files([source]) == [record]  # not registered twice
