"""``train.compile``: ``"auto"`` compiles a group only where the saving expected over its
steps left exceeds the compile's expected cost; true and false force it; the compile's
seconds are recorded in the cache folder for the next estimate, and a run reports them."""

import os
import tomllib

import pytest
from test_train_step import folded_transformers

import ddl_dynamics as dd
from ddl_dynamics.experiment import compiling
from ddl_dynamics.experiment import loop as loop_module
from ddl_dynamics.experiment import step as step_module
from ddl_dynamics.experiment.compiling import PROBE_STEPS, CompileChoice
from ddl_dynamics.experiment.train import train_seeds


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and no graph compiled in this process yet."""
    monkeypatch.setattr(compiling, "_GIVEN", str(tmp_path / "inductor"))
    monkeypatch.setattr(compiling, "_compiled_here", set())
    return tmp_path / "inductor"


def probe(choice, seconds, first=2):
    """Tell ``choice`` of `PROBE_STEPS` eager steps of ``seconds`` from step ``first``."""
    for step in range(first, first + PROBE_STEPS):
        assert not choice.on
        choice.timed(step, seconds)
    return first + PROBE_STEPS - 1


def saving(steps, seconds, gain, last):
    return (steps - last) * seconds * (1 - 1 / gain)


def test_auto_compiles_where_the_steps_left_repay_a_cold_compile_and_not_where_they_do_not():
    cold = compiling.COLD_COMPILE_S
    # 0.1 s steps at gain 2 save 0.05 s a step: 1,000 steps repay a cold compile, 500 do not
    long = CompileChoice("auto", 1000, 2.0, "k", lambda: True)
    choice_at = probe(long, 0.1)
    assert saving(1000, 0.1, 2.0, choice_at) > cold and long.on
    short = CompileChoice("auto", 500, 2.0, "k", lambda: True)
    choice_at = probe(short, 0.1)
    assert saving(500, 0.1, 2.0, choice_at) < cold and not short.on
    short.timed(choice_at + 1, 0.1)  # decided: it stays eager
    assert not short.on and not short.compiled


@pytest.mark.parametrize(
    ("gain", "available"), [(1.0, True), (0.9, True), (2.0, False)], ids=["gain 1", "slower", "no"]
)
def test_auto_never_compiles_a_family_it_does_not_speed_up_or_where_it_cannot(gain, available):
    choice = CompileChoice("auto", 10**6, gain, "k", lambda: available)
    probe(choice, 1.0)
    assert not choice.on and not choice.pending


def test_auto_looks_for_a_compiler_only_where_compiling_would_pay():
    def asked() -> bool:  # looking for a compiler imports inductor: a second a process
        raise AssertionError("asked for a compiler by a group that stays eager")

    short = CompileChoice("auto", 500, 2.0, "k", asked)
    probe(short, 0.1)
    assert not short.on and not short.pending


def test_a_small_ensemble_is_expected_to_gain_less():
    full = compiling.FULL_GAIN_MEMBERS
    assert compiling.expected_gain(1.9, full) == compiling.expected_gain(1.9, 4 * full) == 1.9
    assert compiling.expected_gain(1.9, full // 2) == pytest.approx(1.45)
    assert compiling.expected_gain(1.0, 3) == 1.0  # a family compiling never pays stays at 1


def test_true_and_false_force_it_from_step_2():
    forced = CompileChoice(True, 10, 1.0, "k", lambda: False)
    assert forced.on
    never = CompileChoice(False, 10**6, 3.0, "k", lambda: True)
    probe(never, 1.0)
    assert not never.on


def test_a_compile_records_its_seconds_and_the_next_estimate_reads_them(cache):
    choice = CompileChoice(True, 100, 2.0, "shape-a", lambda: True)
    choice.timed(1, 0.5)  # step 1 runs eagerly (its FLOPs are counted)
    choice.timed(2, 12.5)  # compiles
    assert choice.compiled and choice.seconds == 12.5  # no step after it yet: all of it
    choice.timed(3, 0.5)
    assert choice.seconds == pytest.approx(12.0)
    choice.timed(4, 0.4)
    assert choice.seconds == pytest.approx(12.0)
    assert (cache / "ddl_dynamics" / "shape-a.json").exists()
    assert compiling.expected_cost("shape-a") == 0.0  # compiled in this process: reused
    compiling._compiled_here.clear()  # as a later process sees it
    assert compiling.expected_cost("shape-a") == pytest.approx(12.0)
    assert compiling.expected_cost("shape-b") == compiling.COLD_COMPILE_S
    # a warm shape repays at 150 steps what a cold one would not
    warm = CompileChoice("auto", 150, 2.0, "shape-a", lambda: True)
    probe(warm, 0.2)
    assert warm.on


def test_the_cache_folder_is_the_users_where_given_else_a_stated_one(monkeypatch, tmp_path):
    assert compiling.cache_folder() == tmp_path / "inductor"
    monkeypatch.setattr(compiling, "_GIVEN", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiling.cache_folder() == tmp_path / "xdg" / "ddl_dynamics" / "inductor"
    monkeypatch.delenv(compiling.CACHE_ENV, raising=False)
    compiling.use_cache_folder()
    assert os.environ[compiling.CACHE_ENV] == str(tmp_path / "xdg" / "ddl_dynamics" / "inductor")


class Recording:
    """`compiled_losses` stood in for by the eager losses, counting its calls: the
    decision is under test here, not inductor (compiling takes tens of seconds)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return step_module.member_losses(*args)


def train_transformers(monkeypatch, compile, cold):
    recording = Recording()
    monkeypatch.setattr(step_module, "compiled_losses", recording)
    monkeypatch.setattr(loop_module, "can_compile", lambda: True)
    monkeypatch.setattr(compiling, "COLD_COMPILE_S", cold)
    task, models, _ = folded_transformers()
    cfg = dd.TrainConfig(steps=12, batch_size=8, n_train=32, n_test=16, compile=compile)
    results = train_seeds(task, models, cfg, [0, 1])
    return recording.calls, results


def test_auto_in_training_switches_to_compiled_steps_after_its_probe(monkeypatch, cache):
    calls, results = train_transformers(monkeypatch, "auto", cold=0.0)
    assert calls == 12 - 1 - PROBE_STEPS  # step 1 and the probe ran eagerly
    assert all(r.metrics["compiled"] for r in results)
    assert all(r.metrics["compile_s"] >= 0 for r in results)
    assert compiling._compiled_here  # its shape, compiled: a next group of it costs nothing
    compiling._compiled_here.clear()
    (cache / "ddl_dynamics").rename(cache / "elsewhere")  # nor its record on this machine
    calls, results = train_transformers(monkeypatch, "auto", cold=1e9)
    assert calls == 0 and not any(r.metrics["compiled"] for r in results)
    assert all(r.metrics["compile_s"] == 0 for r in results)
    calls, results = train_transformers(monkeypatch, True, cold=1e9)
    assert calls == 12 and all(r.metrics["compiled"] for r in results)  # step 1 under a mode


def test_compile_in_toml_is_true_false_or_auto_and_auto_keeps_the_eager_key():
    base = """
name = "c"
seeds = [0]
[defaults.train]
steps = 2
{line}
[[tasks]]
name = "overwrite"
[[models]]
name = "resnet"
"""

    def cell(line):
        return dd.expand_cells(dd.parse_experiment(tomllib.loads(base.format(line=line))))[0]

    cells = {value: cell(f"compile = {value}") for value in ("true", "false", '"auto"')}
    default = cell("")
    assert default.train.compile == "auto"
    assert cells["false"].key == cells['"auto"'].key == default.key != cells["true"].key
    with pytest.raises(ValueError, match="'fast' is not one of 'auto', or bool"):
        cell('compile = "fast"')
