"""One module for grids and row identity: the expansion's precedence, where a cell sits on
its grid, and that the trainer's groups and the report's rows are the same cells."""

import dataclasses
from typing import Any

import pytest

import ddl_dynamics as dd
from ddl_dynamics.analysis.run import run_of
from ddl_dynamics.experiment.config import ConfigError
from ddl_dynamics.experiment.grid import (
    check_tune,
    expand,
    grid_value,
    point_text,
    row_identity,
)
from ddl_dynamics.experiment.result import RunResult
from ddl_dynamics.experiment.train import seed_groups, spread


def test_the_most_specific_level_fixes_or_searches_a_field():
    grid, tune = expand(
        [
            ({"lr": 0.1}, {"warmup": (0.0, 0.1)}),
            ({}, {"lr": (1e-3, 1e-2), "grad_clip": (0.5,)}),
            ({"warmup": 0.2}, {}),
        ]
    )
    assert tune == {"lr": [1e-3, 1e-2]}  # warmup fixed again, a one-value grid fixes its field
    assert [(c.lr, c.warmup, c.grad_clip) for c in grid] == [(1e-3, 0.2, 0.5), (1e-2, 0.2, 0.5)]


def test_the_first_searched_field_is_outermost():
    grid, _ = expand([({}, {"lr": (1.0, 2.0), "warmup": (0.0, 0.5)})])
    assert [(c.lr, c.warmup) for c in grid] == [(1.0, 0.0), (1.0, 0.5), (2.0, 0.0), (2.0, 0.5)]


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"steps": [10, 20]}, "not tunable"),
        ({"lrr": [0.1]}, "Did you mean 'lr'?"),
        ({"lr": []}, "non-empty list"),
        ({"lr": [0.1, 0.1]}, "listed twice"),
        ({"lr": ["fast"]}, "tune.lr[0]"),
    ],
)
def test_a_bad_tune_table_names_its_key(table, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("?", r"\?")):
        check_tune(table, "defaults.tune", "x.toml")


def _cells(**tune):
    data = {
        "seeds": [0, 1],
        "tasks": [{"name": "overwrite"}],
        "models": [{"name": "resnet"}, {"name": "ddl"}],
        "defaults": {
            "model": {"width": 4, "depth": 2, "hidden": 4},
            "train": {"steps": 2, "n_train": 8, "n_test": 8, "batch_size": 4},
            "tune": tune,
        },
    }
    return dd.expand_cells(dd.parse_experiment(data))


def test_a_rows_cells_share_one_identity_and_differ_in_their_grid_value():
    cells = _cells(lr=[1e-3, 1e-2])
    assert len(cells) == 8
    identities = {row_identity(c.to_dict()) for c in cells}
    assert len(identities) == 2  # one per row: neither seed nor the searched rate enters
    assert {grid_value(c.to_dict(), ["lr"]) for c in cells} == {(1e-3,), (1e-2,)}
    assert point_text(["lr", "warmup"], (0.003, 100)) == "lr=0.003, warmup=100"
    changed = dataclasses.replace(cells[0], train=dataclasses.replace(cells[0].train, steps=3))
    assert row_identity(changed.to_dict()) not in identities  # a budget is the row's own


def test_the_trainers_groups_are_the_reports_rows():
    cells = _cells(lr=[1e-3, 1e-2])
    groups = seed_groups(cells)
    results = [
        RunResult(
            task=c.task_label,
            model=c.label,
            seed=c.seed,
            config=c.to_dict(),
            key=c.key,
            status="ok",
        )
        for c in cells
    ]
    rows = run_of(results).rows
    assert sorted(len(g) for g in groups) == sorted(len(r.cells) for r in rows.values()) == [4, 4]
    assert {frozenset(c.key for c in g) for g in groups} == {
        frozenset(c.key for c in r.cells) for r in rows.values()
    }


def test_a_few_large_groups_are_shared_out_so_no_worker_waits():
    def groups(*sizes: int) -> list[list[Any]]:
        return [[(g, i) for i in range(n)] for g, n in enumerate(sizes)]

    three = spread(groups(36, 36, 36), workers=2)  # two rows after one another on one worker
    assert [len(g) for g in three] == [18] * 6
    assert sorted(c for g in three for c in g) == sorted(c for g in groups(36, 36, 36) for c in g)
    assert [len(g) for g in spread(groups(36, 36), workers=2)] == [36, 36]  # already even
    assert [len(g) for g in spread(groups(36, 36, 36), workers=1)] == [36] * 3
    assert [len(g) for g in spread(groups(36, 36, 10), workers=2)] == [36, 36, 10]  # shares of 5
    assert len(spread(groups(*[36] * 9), workers=2)) == 9  # the idle tail is one group in nine
