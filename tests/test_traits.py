"""Model families declare their traits (`Model`): the trainer, the grid, the probes and the
report read them from the registered class, so a Delta-like family of the user's, loaded with
``--task-file``, gets the gate-regime table as the built-in ones do."""

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.analysis.report.build import build_report
from ddl_dynamics.cli import main
from ddl_dynamics.experiment import folder as run_folder
from ddl_dynamics.models.base import MODELS, Model, family, register_model

#: A family of the user's, as one file: the delta rule with one gate, declared to erase, with
#: the probe that reports its gates.
MY_DELTA = '''
import torch

from ddl_dynamics import DepthModel, delta_update, gate, normalize_direction, register_model
from ddl_dynamics.models.delta import DeltaProbe


@register_model("my-delta")
class MyDelta(DepthModel):
    """The delta rule, one gate per step: X + βk(v − kᵀX)."""

    erases = True
    probes = True

    def __init__(self, **common):
        super().__init__(**common)
        d = self.state_dim
        self.layers = self.per_layer(lambda: self.branch(d + self.control_dim, d + 2))

    def generators(self, i, state, u_i):
        z = state if u_i is None else torch.cat([state, u_i], dim=-1)
        k_raw, logit, v = self.layer(i)(z).split((self.state_dim, 1, 1), dim=-1)
        return k_raw, v, gate(logit.squeeze(-1), 2.0)

    def step(self, i, state, u_i):
        k_raw, v, beta = self.generators(i, state, u_i)
        return delta_update(state, normalize_direction(k_raw), v.squeeze(-1), beta)

    @torch.no_grad()
    def probe(self, x, u=None, steps=None):
        states = self.trajectory(x, u, steps)
        layers = []
        for i in range(states.shape[1] - 1):
            k_raw, v, beta = self.generators(i, states[:, i], None if u is None else u[:, i])
            layers.append((beta, k_raw, normalize_direction(k_raw), v,
                           states[:, i, :, None], states[:, i + 1, :, None]))
        return DeltaProbe.of_layers(layers, dim=1)
'''

EXPERIMENT = """
name = "mine"
seeds = [0, 1]
tasks = [{ name = "overwrite" }]
models = [{ name = "my-delta" }, { name = "ddl-write" }, { name = "resnet" }]
defaults.model = { width = 8, depth = 3, hidden = 8 }
defaults.train = { steps = 4, eval_every = 2, n_train = 32, n_test = 16 }
"""


@pytest.fixture
def scratch_models(monkeypatch):
    """What a test registers is gone after it."""
    dd.list_models()
    monkeypatch.setattr(MODELS, "_factories", dict(MODELS._factories))
    monkeypatch.setattr(run_folder, "_imported", dict(run_folder._imported))


@pytest.mark.usefixtures("scratch_models")
def test_a_delta_like_family_from_a_task_file_gets_the_regime_table(tmp_path, monkeypatch):
    (tmp_path / "my_delta.py").write_text(MY_DELTA)
    (tmp_path / "mine.toml").write_text(EXPERIMENT)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "mine.toml", "--task-file", "my_delta.py"]) == 0
    dd.check_model(dd.make_model("my-delta", in_dim=3, out_dim=2, control_dim=2, depth=4))
    report = build_report(tmp_path / "runs" / "mine")
    assert [(r.task, r.model) for r in report.regimes] == [("overwrite", "my-delta")]


def test_the_built_in_families_declare_their_traits():
    traits = {name: family(name) for name in dd.list_models()}
    assert all(issubclass(cls, Model) for cls in traits.values())
    assert {n for n, c in traits.items() if c.erases} == {
        "ddl",
        "ddl-decoupled",
        "ddl-product",
        "ddl-transformer",
    }
    assert {n for n, c in traits.items() if c.probes} == {
        "ddl",
        "ddl-decoupled",
        "ddl-product",
        "ddl-transformer",
        "ddl-write",
        "ddl-write-product",
        "ddl-write-transformer",
    }
    assert {n for n, c in traits.items() if c.solves_ode} == {"node", "anode"}
    assert {n for n, c in traits.items() if c.mixes_streams} == {"hc", "mhc"}
    assert {n for n, c in traits.items() if c.kind == "sequence"} == {
        "transformer",
        "ddl-transformer",
        "ddl-write-transformer",
    }


@pytest.mark.usefixtures("scratch_models")
def test_a_family_declares_its_traits_on_a_model_class():
    with pytest.raises(ValueError, match=r"not a subclass of ddl_dynamics\.models\.base\.Model"):
        register_model("a-function", lambda **options: torch.nn.Linear(2, 1))
    assert "a-function" not in dd.list_models()


def test_check_model_refuses_a_family_that_erases_without_a_probe():
    class Unprobed(dd.DepthModel):
        erases = True

        def __init__(self, **common):
            super().__init__(**common)
            self.layers = self.per_layer(lambda: self.branch(self.state_dim, self.state_dim))

        def step(self, i, state, u_i):
            return state + self.layer(i)(state)

    with pytest.raises(ValueError, match="erases = True needs probes = True"):
        dd.check_model(Unprobed(in_dim=2, out_dim=1, depth=2))


def test_check_model_refuses_a_stream_mixer_without_a_matrix_per_layer():
    class Unmixed(dd.DepthModel):
        mixes_streams = True

        def __init__(self, **common):
            super().__init__(**common)
            self.layers = self.per_layer(lambda: self.branch(self.state_dim, self.state_dim))

        def step(self, i, state, u_i):
            return state + self.layer(i)(state)

        def stream_mixing(self):
            return torch.eye(2).expand(self.depth - 1, 2, 2)

    with pytest.raises(ValueError, match=r"mixes_streams = True needs stream_mixing\(\)"):
        dd.check_model(Unmixed(in_dim=2, out_dim=1, depth=2))
