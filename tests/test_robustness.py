"""Bad input, damaged run folders, interrupted runs: each gets one clear message (exit 2), a
warning where the input is legal but likely not meant, and a resumed run equals an
uninterrupted one. Inputs that are files or flags go through the CLI; damaged rows through
a store built here and then edited with SQL."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.cli import main
from ddl_dynamics.experiment.folder import RunFolder
from ddl_dynamics.experiment.train import stamp

TINY = """
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 4
eval_every = 2
n_train = 32
n_test = 16
"""


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def experiment(tmp_path: Path, body: str, base: str = TINY) -> Path:
    """An experiment file: ``base`` (tiny budgets) and ``body``, whose ``seeds`` line (a
    top-level key) goes first."""
    top = [line for line in body.splitlines() if line.startswith("seeds")]
    rest = [line for line in body.splitlines() if not line.startswith("seeds")]
    path = tmp_path / "exp.toml"
    path.write_text("\n".join([*top, base, *rest, ""]))
    return path


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line error of a command that must fail with exit 2 and no traceback."""
    code, _, err = cli(capsys, *argv)
    assert code == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("ddl-dyn: error:")]
    return line


# --- bounds on the new options -------------------------------------------------------------


def test_a_sequence_length_beyond_any_sane_run_is_refused_at_load_time(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "mqar"\nspec = { length = 1000000 }\n[[models]]\nname = "transformer"\n',
        base="",
    )
    start = time.perf_counter()
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "sequence length 1,000,000" in line and "DDL_DYNAMICS_NO_LIMITS" in line
    assert time.perf_counter() - start < 60


def test_a_grid_beyond_any_sane_run_is_refused_before_it_expands(tmp_path, capsys):
    values = {
        f: [round(0.001 * (i + 1), 6) for i in range(40)]
        for f in ("lr", "weight_decay", "warmup", "grad_clip")
    }
    grid = "\n".join(f"{f} = {json.dumps(v)}" for f, v in values.items())
    exp = experiment(
        tmp_path,
        f'[defaults.tune]\n{grid}\n[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n',
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "defaults.tune" in line and "2,560,000 combinations of grid values" in line


def test_bench_repeats_are_bounded(tmp_path, capsys):
    line = refused(
        capsys,
        "bench",
        "--parts",
        "operator",
        "--repeats",
        "1000000000",
        "--output",
        str(tmp_path / "b.json"),
    )
    assert "--repeats" in line and "1,000,000,000" not in line and "10,000" in line


def test_requires_must_be_finite(tmp_path, capsys):
    for value in ("nan", "inf"):
        exp = experiment(
            tmp_path,
            '[[tasks]]\nname = "parity"\n[[models]]\nname = "resnet"\n'
            '[[models]]\nname = "ddl"\n[[comparisons]]\nmodel = "ddl"\n'
            f'control = "resnet"\nrequires = {value}\n',
        )
        line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
        assert "comparisons[0].requires: expected a finite number" in line


def test_a_comparison_on_a_split_an_untied_row_cannot_run_is_refused(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "parity"\n[[models]]\nname = "resnet"\n'
        '[[models]]\nname = "ddl"\n[[comparisons]]\nmodel = "ddl"\n'
        'control = "resnet"\nsplit = "long"\nrequires = 0.9\n',
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "comparisons[0].split" in line and "cannot run split 'long'" in line
    assert "tied = true" in line


def test_a_comparison_and_its_mirror_are_refused(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "parity"\n[[models]]\nname = "resnet"\n'
        '[[models]]\nname = "ddl"\n[[models]]\nname = "ddl-write"\n'
        '[[comparisons]]\nmodel = "ddl"\ncontrol = "ddl-write"\n'
        '[[comparisons]]\nmodel = "ddl-write"\ncontrol = "ddl"\n',
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "comparisons[1]: mirrors comparisons[0]" in line


def test_a_model_entry_that_runs_on_no_task_is_named_and_its_options_checked(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
        '[[models]]\nname = "transformer"\nheads = 3\n'
        "tune = { lr = [-1.0, 0.01] }\n",
        base="",
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "models[1]: 'transformer' runs on no task" in line and "sequence" in line
    assert "models[1].tune.lr: lr must be positive" in line


def test_a_field_fixed_and_tuned_at_one_level_is_refused(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        "[defaults.tune]\nlr = [0.001, 0.01]\n[[tasks]]\n"
        'name = "overwrite"\n[[models]]\nname = "resnet"\n',
        base=TINY.replace("steps = 4", "steps = 4\nlr = 0.003"),
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "defaults.tune.lr: lr is also fixed in defaults.train" in line


def test_ode_max_steps_is_bounded_like_steps(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n',
        base=TINY.replace("steps = 4", f"steps = 4\node_max_steps = {10**30}"),
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "ode_max_steps" in line and "beyond any sane run" in line


@pytest.mark.parametrize("kind", ["folder", "device", "fifo"])
def test_run_on_something_not_a_regular_file_says_so(tmp_path, capsys, kind):
    path = {"folder": tmp_path, "device": Path(os.devnull), "fifo": tmp_path / "fifo"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    line = refused(capsys, "run", str(path), "--run-dir", str(tmp_path / "run"))
    assert "not a regular file" in line and "no such file" not in line


def test_bench_checks_the_experiment_before_timing_anything(tmp_path, capsys):
    code, out, err = cli(
        capsys,
        "bench",
        "--parts",
        "operator,suite",
        "--experiment",
        str(tmp_path / "nope.toml"),
        "--output",
        str(tmp_path / "b.json"),
    )
    assert code == 2 and "no such file" in err and "nope.toml" in err
    assert "Delta update" not in out  # nothing was timed first


def test_bench_into_a_folder_that_is_a_file_says_so(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("")
    line = refused(capsys, "bench", "--parts", "cuda", "--run-dir", str(file))
    assert "a file, not a folder" in line and "Errno" not in line


# --- the config items: every error at once, fixes named, resizing warned -------------------


def test_every_error_of_a_file_is_reported_at_once(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "overwrite"\ntrain = { steps = -1 }\n'
        '[[tasks]]\nname = "parityy"\n[[models]]\nname = "resnet"\n'
        'widht = 3\n[[comparisons]]\nmodel = "resnet"\n',
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "4 errors" in line
    for where in (
        "tasks[0].train: steps must be positive",
        "tasks[1].name",
        "models[0].widht",
        "comparisons[0].control",
    ):
        assert where in line


def test_a_trajectory_task_without_supervise_trajectory_names_the_fix(tmp_path, capsys):
    tasks = tmp_path / "tasks.py"
    tasks.write_text("""
from dataclasses import dataclass
import torch
from ddl_dynamics import Task, TaskData, register_task, split_generator


@register_task("per-step")
@dataclass(frozen=True)
class PerStep(Task):
    depth: int = 3

    @property
    def in_dim(self):
        return 2

    @property
    def out_dim(self):
        return 2

    def sample(self, n, seed, split="train"):
        x = torch.randn(n, 2, generator=split_generator(seed, split))
        return TaskData(x, x[:, None].repeat(1, self.depth, 1), self.depth)
""")
    exp = experiment(tmp_path, '[[tasks]]\nname = "per-step"\n[[models]]\nname = "resnet"\n')
    line = refused(
        capsys, "run", str(exp), "--task-file", str(tasks), "--run-dir", str(tmp_path / "run")
    )
    assert "set supervise = 'trajectory'" in line


def test_match_params_across_tied_and_untied_rows_is_warned(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n'
        '[[models]]\nname = "node"\n[[models]]\nname = "ddl"\n',
        base=TINY.replace("hidden = 8", 'hidden = 8\nmatch_params = "resnet"').replace(
            "steps = 4", "steps = 2\node_max_steps = 20"
        ),
    )
    _, _, err = cli(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"), "--seeds", "1")
    warned = [x for x in err.splitlines() if "match_params" in x]
    assert len(warned) == 1 and "sizes 'node'" in warned[0] and "hidden = " in warned[0]
    assert "'ddl'" not in warned[0]  # an untied row sized like an untied one: as meant


# --- damaged run folders --------------------------------------------------------------------


def scored(label: str, seed: int, test: float, **config) -> dd.RunResult:
    return dd.RunResult(
        status="ok",
        key=f"parity-{label}-{seed}",
        task="parity",
        model=label,
        seed=seed,
        params=100,
        config={"task": "parity", **config},
        metrics={
            "metric": "accuracy",
            "higher_is_better": True,
            "test": test,
            "val": test,
            "train": test,
        },
    )


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """A run folder of hand-made rows: resnet and ddl on parity, three seeds each."""
    store = dd.RunFolder.open(tmp_path, "w").store
    store.start_run("demo", 'name = "demo"')
    for seed in range(3):
        store.put(scored("resnet", seed, 0.5 + 0.01 * seed))
        store.put(scored("ddl", seed, 0.9 - 0.01 * seed))
    return tmp_path


def damage(run_dir: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(run_dir / "results.sqlite") as con:
        con.execute(sql, args)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("UPDATE results SET seed = 'x' WHERE key = 'parity-ddl-1'", "seed is not an integer"),
        (
            "UPDATE results SET status = 'weird' WHERE key = 'parity-ddl-1'",
            "unknown status 'weird'",
        ),
        (
            "UPDATE results SET metrics = json_set(metrics, '$.test', 'abc') "
            "WHERE key = 'parity-ddl-1'",
            "test metric is not a number",
        ),
        (
            "UPDATE results SET metrics = json_set(metrics, '$.val', 'abc') "
            "WHERE key = 'parity-ddl-1'",
            "val metric is not a number",
        ),
        ("UPDATE results SET metrics = '{}' WHERE key = 'parity-ddl-1'", "without metrics"),
    ],
)
def test_a_row_with_bad_values_is_named_as_damaged(stored, capsys, sql, why):
    damage(stored, sql)
    line = refused(capsys, "report", str(stored))
    assert "damaged row" in line and "cell parity-ddl-1" in line and why in line


def test_a_recorded_comparison_without_its_control_is_named(stored, capsys):
    damage(stored, "UPDATE runs SET config = ?", 'name = "demo"\n[[comparisons]]\nmodel = "ddl"\n')
    line = refused(capsys, "report", str(stored))
    assert "damaged experiment record" in line and "comparisons[0]" in line
    assert "'control'" in line


def test_damaged_cells_of_a_run_record_are_named(stored, capsys):
    damage(stored, "UPDATE runs SET cells = '[1, 2'")
    line = refused(capsys, "report", str(stored))
    assert "damaged run record" in line and "runs row 1" in line and "Expecting" not in line


@pytest.mark.parametrize("owner", ["garbage", f"{socket.gethostname()}:abc:x"])
def test_a_damaged_claim_owner_is_named(tmp_path, capsys, owner):
    exp = experiment(tmp_path, '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n')
    cell = dd.expand_cells(dd.load_experiment(exp))[0]
    run = tmp_path / "run"
    dd.RunFolder.open(run, "w").store.claim(cell.key, owner, 0, 120.0)
    line = refused(capsys, "run", str(exp), "--run-dir", str(run))
    assert "damaged claim" in line and "claims table" in line and repr(owner) in line


def tuned_cells(tmp_path: Path) -> list[dd.Cell]:
    exp = experiment(
        tmp_path,
        "[defaults.tune]\nlr = [0.003, 0.01]\n[[tasks]]\n"
        'name = "overwrite"\n[[models]]\nname = "resnet"\n',
    )
    return dd.expand_cells(dd.load_experiment(exp))


@pytest.mark.parametrize("config", ["{}", "strip tune"])
def test_a_row_whose_config_is_not_its_keys_is_named_as_damaged(tmp_path, capsys, config):
    cells = tuned_cells(tmp_path)
    store = dd.RunFolder.open(tmp_path / "run", "w").store
    store.start_run("exp", "", cells=[c.key for c in cells])
    for i, cell in enumerate(cells):
        store.put(
            stamp(
                dd.RunResult(
                    status="ok", metrics={"metric": "mse", "test": 0.1 * i, "val": 0.1 * i}
                ),
                cell,
            )
        )
    if config == "strip tune":
        config = json.dumps({k: v for k, v in cells[0].to_dict().items() if k != "tune"})
    damage(tmp_path / "run", "UPDATE results SET config = ? WHERE key = ?", config, cells[0].key)
    line = refused(capsys, "report", str(tmp_path / "run"))
    assert "damaged row" in line and f"cell {cells[0].key}" in line and "its config" in line


def test_the_report_of_a_tuned_row_where_every_cell_failed(tmp_path, capsys):
    store = dd.RunFolder.open(tmp_path, "w").store
    store.start_run("demo", 'name = "demo"')
    for seed in range(2):
        for lr in (0.001, 0.01):
            store.put(
                dd.RunResult(
                    status="failed",
                    message="boom",
                    key=f"k{seed}{lr}",
                    task="parity",
                    model="resnet",
                    seed=seed,
                    config={
                        "task": "parity",
                        "spec": {},
                        "tune": {"lr": [0.001, 0.01]},
                        "train": {"lr": lr},
                    },
                )
            )
    code, out, _ = cli(capsys, "report", str(tmp_path))
    task = dd.make_task("parity")
    assert code == 0 and "no grid value finished" in out and "lr=0.001" not in out
    assert f"{task.metric_name} {'↑' if task.higher_is_better else '↓'}" in out
    assert "metric ↓" not in out


def small_run(tmp_path: Path, capsys, body: str, *flags: str) -> Path:
    exp = experiment(tmp_path, body)
    run = tmp_path / "run"
    code, _, err = cli(capsys, "run", str(exp), "--run-dir", str(run), *flags)
    assert code in (0, 1), err
    return run


def test_figures_say_which_shown_cells_have_no_weights(tmp_path, capsys):
    run = small_run(
        tmp_path,
        capsys,
        'seeds = [0, 1]\n[[tasks]]\nname = "overwrite"\n[[models]]\nname = "ddl"\n',
    )
    gone = dd.RunFolder.open(run, "w").store.rows()[0]
    RunFolder.open(run).model_path(gone.key).unlink()
    _, _, err = cli(capsys, "plot", "regimes", str(run))
    warned = [x for x in err.splitlines() if "no stored weights" in x]
    assert len(warned) == 1 and gone.key in warned[0] and "1 of 2 shown cells" in warned[0]


def test_resuming_a_tuned_run_compares_cells_at_the_same_grid_value(tmp_path, capsys):
    body = (
        '[defaults.tune]\nlr = [0.003, 0.01]\n[[tasks]]\nname = "overwrite"\n'
        '[[models]]\nname = "resnet"\n'
    )
    run = small_run(tmp_path, capsys, body, "--no-vectorize")
    cells = tuned_cells(tmp_path)
    damage(run, "DELETE FROM results WHERE key = ?", cells[-1].key)  # one grid value missing
    code, _, err = cli(
        capsys, "run", str(tmp_path / "exp.toml"), "--run-dir", str(run), "--no-vectorize"
    )
    assert code == 0 and "another config" not in err


def test_the_report_notes_seeds_trained_in_different_ensembles(tmp_path, capsys):
    body = 'seeds = [0, 1, 2]\n[[tasks]]\nname = "overwrite"\n[[models]]\nname = "ddl"\n'
    run = small_run(tmp_path, capsys, body, "--seeds", "1")
    assert cli(capsys, "run", str(tmp_path / "exp.toml"), "--run-dir", str(run))[0] == 0
    rows = dd.RunFolder.open(run, "w").store.rows()
    assert sorted(r.metrics["ensemble"] for r in rows) == [1, 2, 2]
    assert len({r.metrics["ensemble_id"] for r in rows}) == 2
    assert "seeds trained in different ensembles" in (run / "report.md").read_text()


# --- a run stopped mid-ensemble resumes to the same bits ------------------------------------

ENSEMBLE = (
    'seeds = [0, 1, 2, 3]\n[[tasks]]\nname = "overwrite"\n[[models]]\nname = "ddl"\n'
    '[[models]]\nname = "resnet"\n'
)


def outcome(run: Path) -> dict[str, tuple[object, ...]]:
    """Per cell: its scores, the size of the ensemble it trained in, and its weights."""
    found = {}
    folder = RunFolder.open(run)
    for row in folder.store.rows():
        weights = torch.load(folder.model_path(row.key), weights_only=True)
        found[row.key] = (
            row.status,
            row.metrics["train"],
            row.metrics["val"],
            row.metrics["test"],
            row.metrics["ensemble"],
            row.metrics.get("ensemble_id"),
            {k: v.tolist() for k, v in weights.items()},
        )
    return found


@pytest.fixture
def uninterrupted(tmp_path_factory) -> dict[str, tuple[object, ...]]:
    folder = tmp_path_factory.mktemp("whole")
    exp = experiment(folder, ENSEMBLE)
    dd.run_experiment(exp, folder / "run", progress=False)
    return outcome(folder / "run")


def test_a_store_write_failing_mid_group_resumes_bit_identical(tmp_path, uninterrupted):
    exp = experiment(tmp_path, ENSEMBLE)
    run = tmp_path / "run"
    dd.RunFolder.open(run, "w")
    # the disk "fills" as the second row of a run is written: mid-group
    damage(
        run,
        "CREATE TRIGGER full AFTER INSERT ON results WHEN (SELECT count(*) FROM results)"
        " = 2 BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
    )
    with pytest.raises((OSError, ValueError)):
        dd.run_experiment(exp, run, progress=False)
    damage(run, "DROP TRIGGER full")
    dd.run_experiment(exp, run, progress=False)
    assert outcome(run) == uninterrupted


def test_a_killed_runs_claims_do_not_split_an_ensemble_on_resume(tmp_path, uninterrupted):
    exp = experiment(tmp_path, ENSEMBLE)
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = f"{socket.gethostname()}:{dead.pid}:deadbeef"
    cells = dd.expand_cells(dd.load_experiment(exp))
    store = dd.RunFolder.open(run, "w").store
    for cell in cells[1:3]:  # the killed run held two seeds of the first group
        assert store.claim(cell.key, owner, 0, 120.0) == "claimed"
    dd.run_experiment(exp, run, progress=False)
    assert outcome(run) == uninterrupted


# --- Ctrl-C with workers -------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_with_workers_prints_one_line(tmp_path):
    exp = experiment(
        tmp_path,
        'seeds = [0, 1]\n[[tasks]]\nname = "overwrite"\n'
        '[[tasks]]\nname = "parity"\n[[tasks]]\nname = "depth-recall"\n'
        '[[models]]\nname = "resnet"\n[[models]]\nname = "ddl"\n',
        base=TINY.replace("steps = 4", "steps = 20000"),
    )
    rng = random.Random(0)
    for trial in range(20):
        run = tmp_path / f"run{trial}"
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddl_dynamics.cli",
                "run",
                str(exp),
                "--jobs",
                "2",
                "--run-dir",
                str(run),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_as_from_a_terminal,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _claimed(run):
            time.sleep(0.1)
        time.sleep(rng.uniform(0, 2))
        os.killpg(child.pid, signal.SIGINT)
        try:  # the run and its worker server end at once, not after their interpreters'
            # teardown (seconds with torch loaded, past 10 s on a busy machine), which held
            # stderr open
            _, err = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            raise AssertionError(f"trial {trial}: still running 10 s after Ctrl-C") from None
        lines = [x for x in err.splitlines() if x.startswith("ddl-dyn:")]
        assert child.returncode == 130, f"trial {trial}: {err}"
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, f"trial {trial}: {err}"
        assert lines == ["ddl-dyn: interrupted; finished cells are stored, rerun to resume"]


def _as_from_a_terminal() -> None:
    """Ctrl-C at its default in the run, as a command typed at a terminal has it: a test run
    started in the background by a non-interactive shell inherits it ignored, and Python
    then leaves it ignored, so the run would never see the Ctrl-C sent here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _claimed(run: Path) -> bool:
    """Whether the run has claimed a group (its workers are starting or training)."""
    try:
        with sqlite3.connect(f"file:{run / 'results.sqlite'}?mode=ro", uri=True) as con:
            found = con.execute("SELECT 1 FROM claims WHERE owner IS NOT NULL").fetchone()
    except sqlite3.Error:
        return False
    return found is not None


# --- names, links, compile and short char-lm contexts --------------------------------------


@pytest.mark.parametrize(
    ("name", "said"), [("   ", "is blank"), ("ab\u202ecd", "invisible format character")]
)
def test_an_experiment_name_blank_or_with_format_characters_is_refused(
    tmp_path, capsys, name, said
):
    exp = experiment(tmp_path, '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n')
    exp.write_text(f'name = "{name}"\n' + exp.read_text())  # a top-level key goes first
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert said in line and "runs/<name>" in line


@pytest.mark.parametrize("link", ["dangling", "looping"])
def test_a_broken_link_as_run_folder_says_so(tmp_path, capsys, link):
    exp = experiment(tmp_path, '[[tasks]]\nname = "overwrite"\n[[models]]\nname = "resnet"\n')
    run = tmp_path / "run"
    run.symlink_to(tmp_path / "nowhere" if link == "dangling" else run)
    for argv in (["run", str(exp), "--run-dir", str(run)], ["report", str(run)]):
        line = refused(capsys, *argv)
        assert "a symbolic link to" in line and "does not exist or loops" in line


def test_char_lm_contexts_too_short_to_hold_out_are_refused_at_check_time(tmp_path, capsys):
    exp = experiment(
        tmp_path,
        '[[tasks]]\nname = "char-lm"\nspec = { length = 8, vocab = 16 }\n'
        '[[models]]\nname = "transformer"\n',
        base="",
    )
    line = refused(capsys, "run", str(exp), "--run-dir", str(tmp_path / "run"))
    assert "fails check_task" in line and "of the val windows have a context" in line
    assert not (tmp_path / "run").exists()  # refused before anything trained


@pytest.mark.slow
def test_compile_without_a_compiler_is_said_once_in_one_line(tmp_path):
    exp = experiment(
        tmp_path,
        'seeds = [0, 1]\n[[tasks]]\nname = "overwrite"\n'
        '[[tasks]]\nname = "parity"\n[[models]]\nname = "resnet"\n',
        base=TINY + "compile = true\n",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddl_dynamics.cli",
            "run",
            str(exp),
            "--jobs",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CXX": "/nonexistent"},
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.replace("\r", "\n").splitlines() if "compile" in line]
    assert len(said) == 1 and said[0].startswith("ddl-dyn: warning:"), said
    assert "torch.compile is unavailable here: no C++ compiler" in said[0]
