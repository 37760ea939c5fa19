"""Tuning that finds the optimum: a grid extends past the end its row chose, up to a bound;
and reruns that change their file from the command line (--set, --seeds, --only, --dry-run)."""

import copy

import pytest

import ddl_dynamics as dd
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.config import ConfigError
from ddl_dynamics.experiment.grid import beyond, choice_edge, edge, extensions
from ddl_dynamics.experiment.options import RunOptions, apply, effective_config, recorded
from ddl_dynamics.experiment.result import RunResult

BASE = {
    "name": "t",
    "seeds": [0, 1],
    "tasks": [{"name": "overwrite"}],
    "models": [{"name": "resnet"}],
    "defaults": {
        "model": {"width": 8, "depth": 3, "hidden": 8},
        "train": {"steps": 20, "n_train": 64, "n_test": 32},
        "tune": {"lr": [1e-4, 3e-4]},
    },
}


def experiment(extend=None, **tune):
    data = copy.deepcopy(BASE)
    data["defaults"]["tune"].update(tune)
    if extend is not None:
        data["defaults"]["tune"]["extend"] = extend
    return dd.parse_experiment(data)


def results(cells, val):
    """Stored rows of ``cells`` whose val metric is ``val(lr)`` (overwrite: mse, lower)."""
    return {
        c.key: RunResult("ok", key=c.key, metrics={"val": val(c.train.lr)}, config=c.to_dict())
        for c in cells
    }


def test_edge_marks_either_end_of_any_numeric_grid_of_two_or_more():
    assert edge([1e-3, 1e-2], 1e-2) == 1 and edge([1e-3, 1e-2], 1e-3) == -1  # two values
    assert edge([1e-3, 3e-3, 1e-2], 3e-3) == 0 and edge([1e-3], 1e-3) == 0
    assert edge(["a", "b"], "b") == 0


def test_beyond_is_the_grids_own_ratio_to_three_digits():
    grid = [1e-3, 3e-3, 1e-2]
    assert [beyond("lr", grid, 1, k) for k in (1, 2)] == [0.0333, 0.111]
    assert [beyond("lr", grid, -1, k) for k in (1, 2)] == [0.000333, 0.000111]
    assert beyond("lr", [1e-3, 1e-2], 1, 1) == 0.1
    assert beyond("weight_decay", [0.0, 1e-3], -1, 1) is None  # no ratio below zero
    assert beyond("warmup", [0.1, 0.3], 1, 1) == 0.9
    assert beyond("warmup", [0.1, 0.3], 1, 2) is None  # a fraction would become steps


def test_extensions_step_past_the_chosen_end_until_inside_or_at_the_bound():
    cfg = experiment(lr=[1e-3, 3e-3, 1e-2])
    cells = dd.expand_cells(cfg)
    assert extensions(cells, {}, 2) == []  # nothing until the row's grid has finished
    top = extensions(cells, results(cells, lambda lr: -lr), 2)  # the largest rate is best
    assert [(c.train.lr, c.seed) for c in top] == [(0.0333, 0), (0.0333, 1)]
    assert {c.tune["lr"] == [1e-3, 3e-3, 1e-2] for c in top} == {True}  # the same row
    again = extensions([*cells, *top], results([*cells, *top], lambda lr: -lr), 2)
    assert [c.train.lr for c in again] == [0.111, 0.111]
    done = [*cells, *top, *again]
    assert extensions(done, results(done, lambda lr: -lr), 2) == []  # the bound stops it
    inside = results([*cells, *top], lambda lr: abs(lr - 1e-2))  # 1e-2 is now inside
    assert extensions([*cells, *top], inside, 2) == []
    low = extensions(cells, results(cells, lambda lr: lr), 2)
    assert [c.train.lr for c in low] == [0.000333, 0.000333]
    assert extensions(cells, results(cells, lambda lr: lr), 0) == []


def test_a_plateau_at_the_end_is_inside_the_grid():
    """Where the end a row chose ties the next value inward on val (every rate solves the
    task), its best does not lie beyond: no extension, no edge mark; a strict best at the
    end is still one."""
    cells = dd.expand_cells(experiment(lr=[1e-3, 3e-3, 1e-2]))
    flat = results(cells, lambda lr: 0.0)
    assert extensions(cells, flat, 2) == []
    assert choice_edge(list(flat.values()), ["lr"], 0, higher_is_better=False) == 0
    end = results(cells, lambda lr: 0.0 if lr < 2e-3 else 1.0)  # only the smallest is best
    assert choice_edge(list(end.values()), ["lr"], 0, higher_is_better=False) == -1
    assert [c.train.lr for c in extensions(cells, end, 2)] == [0.000333, 0.000333]


@pytest.mark.parametrize(
    ("extend", "rates"),
    [(None, [1e-4, 3e-4, 9e-4, 2.7e-3]), (1, [1e-4, 3e-4, 9e-4]), (0, [1e-4, 3e-4])],
)
def test_a_run_trains_the_extension_and_a_rerun_does_not_redo_it(extend, rates, tmp_path):
    """At 20 steps the larger rate is better at every rate tried: the two-value grid grows
    to the bound (2 by default), each step's seeds trained together."""
    cfg = experiment(extend)
    summary = dd.run_experiment(cfg, tmp_path, progress=False)
    store = dd.RunFolder.open(tmp_path, "w").store
    rows = store.rows()
    assert sorted({r.config["train"]["lr"] for r in rows}) == rates
    assert summary.ran == len(rows) == 2 * len(rates) and summary.ok
    assert {r.metrics["ensemble"] for r in rows if r.config["train"]["lr"] > 3e-4} <= {2}
    assert store.progress() == dd.experiment.provenance.Progress(len(rows), len(rows), True)
    again = dd.run_experiment(cfg, tmp_path, progress=False)
    assert (again.ran, again.skipped) == (0, len(rows))


def test_extend_is_the_experiments_and_a_count():
    assert experiment().extend == 2 and experiment(0).extend == 0
    with pytest.raises(ConfigError, match=r"defaults.tune.extend: expected a number of grid"):
        experiment(-1)
    data = copy.deepcopy(BASE)
    data["models"][0]["tune"] = {"extend": 1}
    with pytest.raises(ConfigError, match=r"models\[0\].tune.extend: the bound is the exp"):
        dd.parse_experiment(data)


def test_set_reaches_any_key_and_is_checked_like_the_file():
    data = {
        **copy.deepcopy(BASE),
        "tasks": [{"name": "parity"}, {"name": "sign-flip", "label": "flip"}],
    }
    sets = (
        "train.steps=300",
        "tasks.parity.spec.length=8",
        "tasks.flip.spec.variant=1d",
        "tune.lr=[1e-3, 1e-2]",
        "models.0.width=4",
    )
    applied = apply(data, RunOptions(sets, seeds=3), "exp.toml")
    assert applied["defaults"]["train"]["steps"] == 300 and applied["seeds"] == [0, 1, 2]
    assert applied["tasks"][0]["spec"] == {"length": 8}
    assert applied["tasks"][1]["spec"] == {"variant": "1d"}  # no TOML literal: a string
    assert applied["defaults"]["tune"]["lr"] == [1e-3, 1e-2]
    assert applied["models"][0]["width"] == 4 and data["defaults"]["train"]["steps"] == 20
    with pytest.raises(ConfigError, match=r"defaults.train.stpes: unknown key.*steps"):
        dd.parse_experiment(apply(data, RunOptions(("train.stpes=3",)), "exp.toml"))
    with pytest.raises(ConfigError, match=r"no entry labelled 'parrity'.*parity"):
        apply(data, RunOptions(("tasks.parrity.spec.length=8",)), "exp.toml")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply(data, RunOptions(("train.steps",)), "exp.toml")


def test_the_record_reads_as_the_file_and_gives_back_the_config_as_run():
    text = 'name = "t"\nseeds = [4, 5]\n[defaults.train]\nsteps = 20\n'
    options = RunOptions(("train.steps=300",), 3, {"task": ["parity"]})
    record = recorded(text, options)
    assert record.startswith(text) and recorded(text, RunOptions()) == text
    assert effective_config(record) == {
        "name": "t",
        "seeds": [4, 5, 6],
        "defaults": {"train": {"steps": 300}},
        "only": {"task": ["parity"]},
    }
    assert effective_config(text) == {
        "name": "t",
        "seeds": [4, 5],
        "defaults": {"train": {"steps": 20}},
    }


TOML = """name = "cli"
seeds = [0, 1, 2, 3]
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 10
n_train = 64
n_test = 32
[defaults.tune]
lr = [1e-3, 3e-3, 1e-2]
[[tasks]]
name = "overwrite"
[[tasks]]
name = "parity"
[[models]]
name = "resnet"
"""


def test_dry_run_lists_groups_and_trains_nothing(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text(TOML)
    run_dir = tmp_path / "run"
    argv = [
        "run",
        str(path),
        "--run-dir",
        str(run_dir),
        "--set",
        "train.steps=7",
        "--seeds",
        "2",
        "--only",
        "task=parity",
    ]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "cli: 6 cells to train in 1 group"
    assert out[1] == (
        "  parity × resnet: 7 steps; lr=0.001/0.003/0.01; 2 seeds; 6 cells in 1 group of 6"
    )
    assert "up to 4 more cells" in out[2] and not run_dir.exists()
    assert out[3].startswith("estimated training time on idle cores: ")
    assert "with --jobs 1" in out[3] and "each of the 1 groups timed here" in out[3]
    assert main([*argv, "--set", "tune.extend=0"]) == 0
    store = dd.RunFolder.open(run_dir).store
    assert {(r.task, r.seed, r.metrics["steps"]) for r in store.rows()} == {
        ("parity", 0, 7),
        ("parity", 1, 7),
    }
    ran = effective_config(store.experiment()["config"])
    assert ran["defaults"]["train"]["steps"] == 7 and ran["seeds"] == [0, 1]
    assert ran["only"] == {"task": ["parity"]} and ran["defaults"]["tune"]["extend"] == 0


def test_seeds_zero_is_no_count(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text(TOML)
    assert main(["run", str(path), "--seeds", "0", "--dry-run"]) == 2
    assert "a count is at least 1" in capsys.readouterr().err
