"""Experiment files: resolution order, cell keys, and rejection of bad input before training."""

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics._task import TASKS
from ddl_dynamics.experiment.cells import model_options
from ddl_dynamics.experiment.config import Cell, ConfigWarning

FLIP = {"name": "sign-flip", "spec": {"variant": "1d"}, "model": {"width": 1}}

BASE = {
    "name": "t",
    "seeds": [0, 1],
    "defaults": {"model": {"width": 8, "depth": 3, "hidden": 8}, "train": {"steps": 20}},
    "tasks": [{"name": "parity"}, FLIP],
    "models": [
        {"name": "resnet"},
        {"name": "ddl", "beta_init": 0.25},
        {"name": "ddl", "label": "ddl-bmax1", "beta_max": 1.0},
    ],
}


def config(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return dd.parse_experiment(data, source="exp.toml")


def by_label(cells):
    return {(c.task_label, c.label, c.seed): c for c in cells}


def test_cells_cover_tasks_models_seeds_with_resolved_options():
    cells = by_label(dd.expand_cells(config()))
    assert len(cells) == 2 * 3 * 2
    parity_ddl = cells["parity", "ddl", 0]
    # every option is recorded with its default filled in, the gate's init and source too
    assert set(model_options("ddl")) == set(parity_ddl.config)
    assert parity_ddl.config["beta_init"] == 0.25
    assert parity_ddl.config["value_source"] == "branch"
    assert cells["parity", "ddl-bmax1", 0].config["beta_max"] == 1.0
    assert cells["parity", "ddl-bmax1", 0].model == "ddl"
    assert parity_ddl.train.steps == 20 and parity_ddl.spec["depth"] == 3
    # sign-flip 1d's model_defaults fill what the file leaves open
    flip = cells["sign-flip", "resnet", 0].config
    assert (flip["width"], flip["encoder"], flip["decoder"]) == (1, "identity", "identity")


def test_a_model_entry_can_be_limited_to_some_tasks():
    models = [
        *BASE["models"],
        {"name": "ddl", "label": "ddl-tied", "tied": True, "tasks": ["parity"]},
    ]
    cells = by_label(dd.expand_cells(config(models=models)))
    assert ("parity", "ddl-tied", 0) in cells and ("sign-flip", "ddl-tied", 0) not in cells
    assert cells["parity", "ddl-tied", 0].config["tied"] is True
    with pytest.raises(dd.ConfigError, match=r"models\[3\]\.tasks.*'parit'.*Did you mean"):
        config(models=[*BASE["models"], {"name": "ddl", "label": "x", "tasks": "parit"}])


def test_resolution_order_defaults_task_model_override():
    cells = by_label(
        dd.expand_cells(
            config(
                tasks=[
                    {
                        "name": "parity",
                        "model": {"hidden": 4},
                        "train": {"lr": 0.01},
                        "spec": {"depth": 5},
                    }
                ],
                models=[{"name": "resnet", "train": {"lr": 0.02}}, {"name": "ddl", "hidden": 6}],
                overrides=[{"models": ["ddl"], "model": {"hidden": 7}, "train": {"steps": 9}}],
            )
        )
    )
    resnet, ddl = cells["parity", "resnet", 0], cells["parity", "ddl", 0]
    assert resnet.config["hidden"] == 4 and resnet.train.lr == 0.02
    assert ddl.config["hidden"] == 7 and ddl.train.steps == 9 and ddl.train.lr == 0.01
    assert resnet.train.steps == 20
    # a task's spec.depth is its models' depth
    assert resnet.config["depth"] == resnet.spec["depth"] == 5


def test_ode_max_steps_caps_only_ode_models_and_is_overridable():
    cells = by_label(
        dd.expand_cells(
            config(
                tasks=[{"name": "parity"}],
                models=[{"name": "node"}, {"name": "anode", "max_steps": 50}, {"name": "resnet"}],
                defaults={"train": {"ode_max_steps": 30}},
            )
        )
    )
    assert cells["parity", "node", 0].config["max_steps"] == 30
    assert cells["parity", "anode", 0].config["max_steps"] == 50
    assert "max_steps" not in cells["parity", "resnet", 0].config


def test_keys_are_stable_and_distinct():
    first = [c.key for c in dd.expand_cells(config())]
    assert first == [c.key for c in dd.expand_cells(config())]
    assert len(set(first)) == len(first)
    changed = [c.key for c in dd.expand_cells(config(defaults={"train": {"steps": 21}}))]
    assert not set(first) & set(changed)
    cell = dd.expand_cells(config())[0]
    assert Cell.from_dict(cell.to_dict()).key == cell.key


def test_filters_and_overrides():
    cfg = config()
    cells = dd.expand_cells(cfg, seeds=[7], device="cpu", only={"model": ["ddl-bmax1"]})
    assert {(c.label, c.seed) for c in cells} == {("ddl-bmax1", 7)}
    with pytest.raises(ValueError, match="Did you mean 'ddl-bmax1'"):
        dd.expand_cells(cfg, only={"model": ["ddl-bmax"]})


def test_int_where_float_is_fine():
    cell = dd.expand_cells(config(defaults={"train": {"lr": 1}}))[0]
    assert cell.train.lr == 1.0 and isinstance(cell.train.lr, float)


@pytest.mark.parametrize(
    ("changes", "where", "hint"),
    [
        ({"seed": [0]}, "seed", "Did you mean 'seeds'"),
        ({"defaults": {"trian": {}}}, "defaults.trian", "Did you mean 'train'"),
        ({"defaults": {"train": {"stpes": 3}}}, "defaults.train.stpes", "Did you mean 'steps'"),
        ({"tasks": [{"name": "parrity"}]}, "tasks[0].name", "Did you mean 'parity'"),
        (
            {"tasks": [{"name": "parity", "spec": {"dpeth": 3}}]},
            "tasks[0].spec.dpeth",
            "Did you mean 'depth'",
        ),
        ({"models": [{"name": "ddll"}]}, "models[0].name", "Did you mean 'ddl'"),
        (
            {"models": [{"name": "ddl", "beta_maxx": 1.0}]},
            "models[0].beta_maxx",
            "Did you mean 'beta_max'",
        ),
        ({"defaults": {"model": {"widht": 8}}}, "defaults.model.widht", "Did you mean 'width'"),
        ({"overrides": [{"models": ["rsnet"]}]}, "overrides[0].models", "Did you mean 'resnet'"),
    ],
)
def test_unknown_names_fail_with_path_and_hint(changes, where, hint):
    with pytest.raises(dd.ConfigError) as err:
        config(**changes)
    assert f"exp.toml: {where}" in str(err.value)
    assert hint in str(err.value)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"defaults": {"train": {"steps": "100"}}}, "defaults.train.steps: expected int"),
        ({"defaults": {"train": {"steps": 2.5}}}, "expected int, got float"),
        ({"models": [{"name": "resnet", "tied": 1}]}, "tied: expected bool"),
        ({"models": [{"name": "ddl", "beta_max": "2"}]}, "beta_max: expected float"),
        ({"models": [{"name": "ddl", "beta_max": 3.0}]}, "beta_max must lie in (0, 2]"),
        ({"defaults": {"train": {"steps": 0}}}, "steps must be positive"),
        ({"seeds": [0, "1"]}, "seeds"),
        ({"models": [{"name": "resnet", "in_dim": 3}]}, "set by the task"),
        ({"models": [{"name": "ddl"}, {"name": "ddl"}]}, "duplicate label 'ddl'"),
        ({"tasks": []}, "at least one [[tasks]]"),
    ],
)
def test_wrong_types_and_values_fail(changes, fragment):
    with pytest.raises(dd.ConfigError) as err:
        config(**changes)
    assert fragment in str(err.value)


def test_load_experiment_reads_toml_and_rejects_malformed(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        'seeds = [3]\n[[tasks]]\nname = "parity"\n[[models]]\nname = "ddl"\n'
        'label = "ddl-bmax1"\nbeta_max = 1.0\n'
    )
    cfg = dd.load_experiment(good)
    assert cfg.name == "good" and cfg.seeds == (3,) and cfg.text == good.read_text()
    assert dd.expand_cells(cfg)[0].config["beta_max"] == 1.0
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[[tasks]\nname = "parity"\n')
    with pytest.raises(dd.ConfigError, match=r"bad\.toml: malformed TOML.*line 2"):
        dd.load_experiment(bad)
    with pytest.raises(dd.ConfigError, match="no such file"):
        dd.load_experiment(tmp_path / "missing.toml")
    with pytest.raises(dd.ConfigError, match=r"no such file\. Did you mean 'good'\?"):
        dd.load_experiment(tmp_path / "god.toml")
    with pytest.raises(dd.ConfigError, match=r"no such file$"):
        dd.load_experiment(tmp_path / "zzz.toml")


# --- matched parameters and baselines

FAMILIES = ["resnet", "gated", "node", "anode", "ddl", "ddl-write"]
MATCHED = {
    "name": "m",
    "defaults": {"model": {"width": 8, "depth": 3, "hidden": 8}},
    "tasks": [{"name": "parity"}, FLIP],
}


def matched(models, **changes):
    return dd.parse_experiment(
        {**copy.deepcopy(MATCHED), "models": models, **changes}, source="exp.toml"
    )


def built_params(cell):
    return dd.count_parameters(cell.build()[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_match_params_by_label_and_by_number_for_every_family(family):
    cells = by_label(
        dd.expand_cells(
            matched(
                [
                    {"name": "resnet", "label": "ref", "hidden": 24},
                    {"name": family, "label": "by-label", "match_params": "ref"},
                    {"name": family, "label": "by-number", "match_params": 3000},
                ]
            )
        )
    )
    for task in ("parity", "sign-flip"):
        reference = built_params(cells[task, "ref", 0])
        by_name, by_count = cells[task, "by-label", 0], cells[task, "by-number", 0]
        assert by_name.params_target == reference and by_name.match_params == "ref"
        assert abs(built_params(by_name) - reference) <= 0.1 * reference
        assert by_count.params_target == 3000 and by_count.match_params == 3000
        assert abs(built_params(by_count) - 3000) <= 300
        assert "match_params" not in by_name.config  # a cell's key, not a model option
        assert by_name.to_dict()["params_target"] == reference


def test_match_params_from_defaults_task_and_override_and_recorded_hidden():
    cells = by_label(
        dd.expand_cells(
            matched(
                [
                    {"name": "resnet"},
                    {"name": "gated"},
                    {"name": "node", "match_params": "gated"},
                    {"name": "ddl"},
                ],
                defaults={"model": {"width": 8, "depth": 3, "hidden": 8, "match_params": "resnet"}},
                tasks=[{"name": "parity", "model": {"hidden": 16}}],
                overrides=[{"models": ["ddl"], "model": {"match_params": 5000}}],
            )
        )
    )
    resnet, gated = cells["parity", "resnet", 0], cells["parity", "gated", 0]
    assert resnet.config["hidden"] == 16 and resnet.params_target == built_params(resnet)
    assert gated.params_target == built_params(resnet) and gated.config["hidden"] != 16
    assert cells["parity", "node", 0].params_target == built_params(gated)  # a chain
    assert cells["parity", "ddl", 0].params_target == 5000
    assert all(c.match_params is None for c in dd.expand_cells(config()))


@pytest.mark.parametrize(
    ("models", "fragment"),
    [
        (
            [{"name": "ddl", "match_params": "resnt"}],
            "models[0].match_params: no entry labelled 'resnt'",
        ),
        ([{"name": "ddl", "match_params": 0}], "expected a model label or a parameter count"),
        ([{"name": "ddl", "match_params": 2.5}], "expected a model label or a parameter count"),
        (
            [{"name": "ddl", "match_params": "node"}, {"name": "node", "match_params": "ddl"}],
            "refers back to itself",
        ),
        ([{"name": "ddl", "match_params": 10}], "task 'parity' × model 'ddl': match_params = 10"),
        ([{"name": "ddl", "baseline": "resnet"}], "models[0].baseline: no entry labelled"),
        ([{"name": "ddl", "baseline": "ddl"}], "a row cannot be its own baseline"),
        ([{"name": "ddl", "baseline": 3}], "models[0].baseline: expected a string"),
        (
            [{"name": "resnet", "tasks": ["parity"]}, {"name": "ddl", "baseline": "resnet"}],
            "'resnet' does not run on task 'sign-flip'",
        ),
    ],
)
def test_bad_references_fail_at_load_time(models, fragment):
    with pytest.raises(dd.ConfigError) as err:
        matched(models)
    assert fragment in str(err.value)


def test_baselines_default_to_resnet_explicit_ones_win_and_heads_have_none():
    cells = by_label(
        dd.expand_cells(
            matched(
                [
                    {"name": "resnet"},
                    {"name": "ddl"},
                    {"name": "resnet", "label": "resnet-tied", "tied": True},
                    {"name": "ddl", "label": "ddl-tied", "tied": True, "baseline": "resnet-tied"},
                    {"name": "node", "baseline": "resnet-tied"},
                    {"name": "anode", "baseline": "node"},
                ]
            )
        )
    )
    baselines = {label: cells["parity", label, 0].baseline for _, label, _ in cells}
    assert baselines == {
        "resnet": None,
        "ddl": "resnet",
        "resnet-tied": None,
        "ddl-tied": "resnet-tied",
        "node": "resnet-tied",
        "anode": "node",
    }
    assert cells["parity", "ddl", 0].to_dict()["baseline"] == "resnet"


def test_top_level_baseline_and_no_default_without_resnet():
    cells = by_label(dd.expand_cells(matched([{"name": "gated"}, {"name": "ddl"}])))
    assert {c.baseline for c in cells.values()} == {None}
    cells = by_label(
        dd.expand_cells(matched([{"name": "gated"}, {"name": "ddl"}], baseline="gated"))
    )
    assert cells["parity", "ddl", 0].baseline == "gated"
    assert cells["parity", "gated", 0].baseline is None
    # a default baseline that does not run on a task leaves that task's rows without one
    models = [{"name": "gated", "tasks": ["parity"]}, {"name": "ddl"}]
    cells = by_label(dd.expand_cells(matched(models, baseline="gated")))
    assert cells["parity", "ddl", 0].baseline == "gated"
    assert cells["sign-flip", "ddl", 0].baseline is None
    with pytest.raises(dd.ConfigError, match=r"exp\.toml: baseline: no entry labelled 'gatd'"):
        matched([{"name": "gated"}], baseline="gatd")


def test_seeds_given_to_cells_and_train_values_given_in_python_are_checked_too():
    cfg = config()
    with pytest.raises(ValueError, match="seeds: seed -1 is not an integer 0 ≤ seed < 2"):
        dd.expand_cells(cfg, seeds=[-1])
    with pytest.raises(ValueError, match="seeds: seed 3 is given twice"):
        dd.expand_cells(cfg, seeds=[3, 1, 3])
    with pytest.raises(ValueError, match=r"seeds: seed 9223372036854775808 is not"):
        dd.expand_cells(cfg, seeds=[2**63])
    with pytest.raises(ValueError, match="lr must be a finite number, got nan"):
        dd.TrainConfig(lr=math.nan)


def test_a_default_that_a_task_replaces_is_named_in_a_warning(recwarn):
    sign_flip = {"name": "sign-flip", "spec": {"variant": "1d"}}
    cells = by_label(dd.expand_cells(config(tasks=[sign_flip])))
    assert [str(w.message) for w in recwarn if w.category is ConfigWarning] == [
        "exp.toml: [defaults.model] width = 8 does not apply to task 'sign-flip', which sets "
        "width = 1"
    ]
    assert cells["sign-flip", "resnet", 0].config["width"] == 1  # the task's model_defaults win
    recwarn.clear()  # the same width set for the task itself is the file's choice: no note
    config(tasks=[FLIP])
    assert not [w for w in recwarn if w.category is ConfigWarning]


# --- sweeps of a task's spec

SWEEP = {"name": "switched", "spec": {"event": ["overwrite", "reflect"], "p": [0, 0.05, 1]}}


def swept(tasks=(SWEEP,), **changes):
    return config(tasks=list(copy.deepcopy(tasks)), **changes)


def test_a_spec_list_expands_into_one_entry_per_combination_with_readable_labels():
    cfg = swept()
    labels = [t.label for t in cfg.tasks]
    assert labels == [
        f"switched[event={e},p={p}]" for e in ("overwrite", "reflect") for p in ("0", "0.05", "1")
    ]
    first = cfg.tasks[0]
    assert first.spec == {"event": "overwrite", "p": 0.0} and isinstance(first.spec["p"], float)
    assert {t.sweep for t in cfg.tasks} == {"switched"}
    cells = by_label(dd.expand_cells(cfg))
    assert len(cells) == 6 * 3 * 2
    cell = cells["switched[event=reflect,p=0.05]", "ddl", 1]
    assert (cell.task, cell.spec["event"], cell.spec["p"]) == ("switched", "reflect", 0.05)
    # an unswept field stays one value, and a label of its own replaces the task's name
    cfg = swept([{"name": "switched", "label": "sw", "spec": {"event": "mixed", "p": [0.5, 1]}}])
    assert [t.label for t in cfg.tasks] == ["sw[p=0.5]", "sw[p=1]"]
    assert cfg.tasks[1].spec == {"event": "mixed", "p": 1.0}


def test_a_swept_depth_sets_each_entrys_model_depth():
    cfg = swept([{"name": "parity", "spec": {"depth": [3, 5]}}])
    cells = by_label(dd.expand_cells(cfg))
    assert cells["parity[depth=5]", "resnet", 0].config["depth"] == 5
    assert cells["parity[depth=3]", "ddl", 0].spec["depth"] == 3


def test_sweep_labels_name_one_entry_and_the_sweeps_label_all_of_them():
    models = [
        *BASE["models"],
        {"name": "ddl", "label": "ddl-p1", "tasks": ["switched[event=reflect,p=1]"]},
        {"name": "ddl", "label": "ddl-all", "tasks": "switched"},
    ]
    overrides = [
        {"tasks": ["switched[event=overwrite,p=0]"], "train": {"steps": 7}},
        {"tasks": "switched", "models": ["ddl-all"], "train": {"lr": 0.01}},
    ]
    cfg = swept(models=models, overrides=overrides)
    cells = by_label(dd.expand_cells(cfg))
    assert {t for t, m, _ in cells if m == "ddl-p1"} == {"switched[event=reflect,p=1]"}
    assert len({t for t, m, _ in cells if m == "ddl-all"}) == 6
    assert cells["switched[event=overwrite,p=0]", "resnet", 0].train.steps == 7
    assert cells["switched[event=overwrite,p=0.05]", "resnet", 0].train.steps == 20
    assert {c.train.lr for (_, m, _), c in cells.items() if m == "ddl-all"} == {0.01}
    only = dd.expand_cells(cfg, only={"task": ["switched[event=reflect,p=0.05]"], "model": ["ddl"]})
    assert {(c.task_label, c.label) for c in only} == {("switched[event=reflect,p=0.05]", "ddl")}
    sweep = dd.expand_cells(cfg, only={"task": ["switched"]}, seeds=[0])
    assert len(sweep) == 6 * 4 + 1  # + ddl-p1
    with pytest.raises(ValueError, match=r"no task labelled 'switched\[p=0\]'.*Did you mean"):
        dd.expand_cells(cfg, only={"task": ["switched[p=0]"]})
    with pytest.raises(dd.ConfigError, match=r"models\[3\]\.tasks: no entry labelled 'swiched'"):
        swept(models=[*BASE["models"], {"name": "ddl", "label": "x", "tasks": ["swiched"]}])


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"p": [0, "x"]}, "tasks[0].spec.p[1]: expected float, got str 'x'"),
        ({"p": [0, True]}, "tasks[0].spec.p[1]: expected float, got bool"),
        ({"p": []}, "tasks[0].spec.p: an empty list sweeps nothing"),
        ({"p": [0, 0.5, 0.0]}, "tasks[0].spec.p[2]: 0.0 is swept twice"),
        ({"p": [0.5, 1.5]}, "task 'switched[p=1.5]' × model 'resnet': p must lie in [0, 1]"),
        ({"event": ["reflect", "refelct"]}, "unknown switched event 'refelct'"),
        ({"pp": [0, 1]}, "tasks[0].spec.pp: unknown key"),
    ],
)
def test_every_swept_value_is_checked_like_a_single_one(spec, fragment):
    with pytest.raises(dd.ConfigError) as err:
        swept([{"name": "switched", "spec": spec}])
    assert fragment in str(err.value)


def test_two_sweeps_under_one_label_collide():
    tasks = [
        {"name": "switched", "spec": {"p": [0, 1]}},
        {"name": "switched", "spec": {"p": 1}},
        {"name": "switched", "spec": {"p": [1]}},
    ]
    with pytest.raises(dd.ConfigError, match=r"tasks\.label: duplicate label 'switched\[p=1\]'"):
        swept(tasks)


@dataclasses.dataclass(frozen=True)
class Shapes(dd.Task):
    """A task whose spec field is itself a list of sizes."""

    sizes: tuple[int, ...] = (1, 2)

    @property
    def in_dim(self) -> int:
        return 1

    @property
    def out_dim(self) -> int:
        return 1

    def sample(self, n, seed, split="train"):
        x = torch.randn(n, 1, generator=dd.split_generator(seed, split))
        return dd.TaskData(x, x, self.depth)


def test_a_list_typed_field_takes_a_list_as_one_value_and_a_list_of_lists_sweeps_it(monkeypatch):
    monkeypatch.setitem(TASKS._factories, "shapes", Shapes)
    one = swept([{"name": "shapes", "spec": {"sizes": [3, 4]}}])
    assert [(t.label, t.spec["sizes"]) for t in one.tasks] == [("shapes", [3, 4])]
    empty = swept([{"name": "shapes", "spec": {"sizes": []}}])
    assert empty.tasks[0].spec["sizes"] == []
    many = swept([{"name": "shapes", "spec": {"sizes": [[3], [4, 5]]}}])
    assert [(t.label, t.spec["sizes"]) for t in many.tasks] == [
        ("shapes[sizes=[3]]", [3]),
        ("shapes[sizes=[4,5]]", [4, 5]),
    ]


EXPERIMENTS = sorted((Path(__file__).parents[1] / "experiments").glob("*.toml"))
#: Files whose parameter matching builds hundreds of Transformers: loaded in the slow run.
HEAVY = {
    "transformer-depth.toml",
    "transformer-gpu.toml",
    "full.toml",
    "peers-erase.toml",
    "peers-rotation.toml",
    "peers-streams.toml",
}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in HEAVY else p for p in EXPERIMENTS],
    ids=lambda p: p.name,
)
def test_every_shipped_experiment_file_loads(path):
    assert dd.expand_cells(dd.load_experiment(path))


def test_the_quick_crossover_is_the_three_crossover_files_at_fewer_steps_and_seeds():
    names = ("crossover-overwrite", "crossover-reflect", "crossover-node")
    parts = [dd.load_experiment(EXPERIMENTS[0].parent / f"{name}.toml") for name in names]
    quick = dd.load_experiment(EXPERIMENTS[0].parent / "crossover-quick.toml")
    assert {len(part.seeds) for part in parts} == {12} and len(quick.seeds) == 3
    assert {c for part in parts for c in part.comparisons} == set(quick.comparisons)

    def key(cell):  # what a cell trains, its task's label and the steps aside
        return (
            cell.task,
            sorted(cell.spec.items()),
            cell.label,
            sorted(cell.config.items()),
            dataclasses.replace(cell.train, steps=1),
        )

    quick_cells = {repr(key(c)): c for c in dd.expand_cells(quick, seeds=[0])}
    split_cells = [c for part in parts for c in dd.expand_cells(part, seeds=[0])]
    assert len(split_cells) == (6 + 5) * 5 * 3 + 12 * 2 * 3
    for cell in split_cells:
        assert cell.train.steps > quick_cells[repr(key(cell))].train.steps


def test_a_tune_grid_gives_one_cell_per_seed_and_value_and_the_most_specific_level_wins():
    cfg = config(
        defaults={**BASE["defaults"], "tune": {"lr": [1e-3, 1e-2]}},
        models=[
            {"name": "resnet"},
            {"name": "ddl", "train": {"lr": 3e-3}},  # fixes what defaults tune
            {
                "name": "ddl",
                "label": "ddl-b1",
                "beta_max": 1.0,
                "tune": {"lr": [1e-3], "grad_clip": [0.5, 1]},
            },
        ],
        overrides=[{"models": ["resnet"], "tasks": ["sign-flip"], "tune": {"warmup": [0, 0.1]}}],
    )
    cells = dd.expand_cells(cfg)
    grid = {(c.task_label, c.label): set() for c in cells}
    for c in cells:
        grid[c.task_label, c.label].add((c.seed, c.train.lr, c.train.grad_clip, c.train.warmup))
        assert (
            c.tune
            == {
                "parity": {
                    "resnet": {"lr": [1e-3, 1e-2]},
                    "ddl": {},
                    "ddl-b1": {"grad_clip": [0.5, 1.0]},
                },
                "sign-flip": {
                    "resnet": {"lr": [1e-3, 1e-2], "warmup": [0.0, 0.1]},
                    "ddl": {},
                    "ddl-b1": {"grad_clip": [0.5, 1.0]},
                },
            }[c.task_label][c.label]
        )
    assert grid["parity", "resnet"] == {(s, lr, 1.0, 0.05) for s in (0, 1) for lr in (1e-3, 1e-2)}
    assert grid["parity", "ddl"] == {(s, 3e-3, 1.0, 0.05) for s in (0, 1)}
    assert grid["parity", "ddl-b1"] == {(s, 1e-3, g, 0.05) for s in (0, 1) for g in (0.5, 1.0)}
    assert len(grid["sign-flip", "resnet"]) == 2 * 2 * 2
    assert len({c.key for c in cells}) == len(cells)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"defaults": {"tune": {"steps": [10, 20]}}},
            "defaults.tune.steps: not tunable: a row's budget is the same at every grid value",
        ),
        ({"defaults": {"tune": {"rl": [1e-3]}}}, "Did you mean 'lr'"),
        ({"defaults": {"tune": {"lr": 1e-3}}}, "expected a non-empty list of values"),
        ({"defaults": {"tune": {"lr": []}}}, "expected a non-empty list of values"),
        ({"defaults": {"tune": {"lr": [1e-3, "x"]}}}, "defaults.tune.lr[1]: expected float"),
        ({"defaults": {"tune": {"lr": [1e-3, 0.001]}}}, "listed twice"),
        ({"defaults": {"tune": {"lr": [1e-3, -1.0]}}}, "lr must be positive"),
        (
            {"models": [{"name": "resnet", "tune": {"lr": [1e-3, math.nan]}}]},
            "models[0].tune.lr[1]: expected a finite number",
        ),
    ],
)
def test_bad_tune_grids_fail_at_load_time(changes, fragment):
    with pytest.raises(dd.ConfigError) as err:
        config(**changes)
    assert fragment in str(err.value)


def test_declared_comparisons_are_checked_and_kept():
    tied = [
        {"name": "ddl", "label": "ddl-tied", "tied": True},
        {"name": "resnet", "label": "resnet-tied", "tied": True},
    ]
    cfg = config(
        models=[*BASE["models"], *tied],
        comparisons=[
            {"model": "ddl", "control": "ddl-bmax1"},
            {
                "model": "ddl-tied",
                "control": "resnet-tied",
                "tasks": ["parity"],
                "split": "long",
                "requires": 0.99,
            },
        ],
    )
    assert cfg.comparisons == (
        dd.ComparisonSpec("ddl", "ddl-bmax1"),
        dd.ComparisonSpec("ddl-tied", "resnet-tied", ("parity",), "long", 0.99),
    )


@pytest.mark.parametrize(
    ("comparison", "fragment"),
    [
        ({"model": "ddl", "control": "ddl"}, "compared with itself"),
        ({"model": "ddl", "control": "ddll"}, "Did you mean 'ddl'"),
        ({"model": "ddl"}, "comparisons[0].control: expected a string"),
        ({"model": "ddl", "control": "resnet", "split": "long"}, "must state `requires`"),
        (
            {
                "model": "ddl",
                "control": "resnet",
                "tasks": ["parity"],
                "split": "longg",
                "requires": 1,
            },
            "task 'parity' has no split 'longg'",
        ),
        (
            {
                "model": "ddl",
                "control": "resnet",
                "tasks": ["sign-flip"],
                "split": "long",
                "requires": 1,
            },
            "task 'sign-flip' has no split 'long'",
        ),
        (
            {"model": "ddl", "control": "resnet", "tasks": ["parity"], "requires": True},
            "comparisons[0].requires: expected a finite number",
        ),
        # one number for an accuracy and an MSE: 0.99 would read "test mse ≤ 0.99"
        (
            {"model": "ddl", "control": "resnet", "split": "long", "requires": 0.99},
            "one threshold for tasks whose metrics differ (accuracy on parity; mse on sign-flip)",
        ),
        (
            {"model": "ddl", "control": "resnet", "tasks": ["parity"], "requires": 1.5},
            "an accuracy lies in [0, 1], got 1.5",
        ),
        (
            {"model": "ddl", "control": "resnet", "requires": {"accuracy": 0.99, "mae": 0.1}},
            "comparisons[0].requires.mae: not a metric",
        ),
        (
            {"model": "ddl", "control": "resnet", "requires": {"accuracy": 0.99}},
            "no threshold for mse (on sign-flip)",
        ),
        ({"model": "ddl", "control": "resnet", "extra": 1}, "comparisons[0].extra: unknown key"),
        (
            {"model": "ddl", "control": "resnet", "control_larger": "yes"},
            "comparisons[0].control_larger: expected true or false, got 'yes'",
        ),
    ],
)
def test_bad_comparisons_fail_at_load_time(comparison, fragment):
    with pytest.raises(dd.ConfigError) as err:
        config(comparisons=[comparison])
    assert fragment in str(err.value)


def test_a_control_declared_larger_is_kept():
    spec = config(comparisons=[{"model": "ddl", "control": "resnet", "control_larger": True}])
    assert spec.comparisons[0].control_larger
    assert (
        not config(comparisons=[{"model": "ddl", "control": "resnet"}])
        .comparisons[0]
        .control_larger
    )


def test_requires_by_metric_is_kept_and_read_per_task():
    cfg = config(
        comparisons=[
            {"model": "ddl", "control": "resnet", "requires": {"accuracy": 0.99, "mse": 0.01}}
        ]
    )
    (spec,) = cfg.comparisons
    assert (spec.threshold("accuracy"), spec.threshold("mse"), spec.threshold("bpc")) == (
        0.99,
        0.01,
        None,
    )
    one = config(
        comparisons=[{"model": "ddl", "control": "resnet", "tasks": ["parity"], "requires": 1}]
    ).comparisons[0]
    assert one.requires == 1.0 and one.threshold("accuracy") == 1.0


def test_a_comparison_between_rows_that_share_no_task_fails():
    models = [
        *BASE["models"],
        {"name": "gated", "tasks": ["parity"]},
        {"name": "ddl-write", "tasks": ["sign-flip"]},
    ]
    with pytest.raises(dd.ConfigError, match="'gated' and 'ddl-write' share no task"):
        config(models=models, comparisons=[{"model": "gated", "control": "ddl-write"}])
    with pytest.raises(dd.ConfigError, match="do not both run task 'sign-flip'"):
        config(
            models=models,
            comparisons=[{"model": "gated", "control": "ddl", "tasks": ["sign-flip"]}],
        )


def test_limits_catch_a_typo_and_give_way_to_a_user_who_means_it(monkeypatch):
    steps = {
        "defaults": {"model": {"width": 8, "depth": 3, "hidden": 8}, "train": {"steps": 10**9}}
    }
    with pytest.raises(dd.ConfigError, match="steps = 1000000000 is beyond any sane run"):
        config(**steps)
    monkeypatch.setenv("DDL_DYNAMICS_NO_LIMITS", "1")
    assert {cell.train.steps for cell in dd.expand_cells(config(**steps))} == {10**9}
