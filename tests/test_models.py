"""Depth-model families: the shared interface, tied weights, DDL identities, configs, sizing."""

import pytest
import torch
from torch import nn

from ddl_dynamics import (
    DepthModel,
    check_model,
    count_parameters,
    list_models,
    make_model,
    normalize_direction,
    write_update,
)
from ddl_dynamics.models.params import match_hidden

PEERS = ["ddl-decoupled", "ddl-product", "ddl-write-product", "hc", "mhc"]
FAMILIES = ["anode", "ddl", "ddl-write", "gated", "node", "resnet", *PEERS]
DISCRETE = ["ddl", "ddl-write", "gated", "resnet", *PEERS]
BASE = {"in_dim": 3, "out_dim": 2, "width": 8, "depth": 4, "hidden": 8}

VARIANTS = [
    *[(name, {}) for name in FAMILIES],
    *[(name, {"tied": True, "control_dim": 2}) for name in FAMILIES],
    ("resnet", {"step_size": 0.25, "activation": "silu"}),
    ("ddl", {"value_channels": 4}),
    ("ddl", {"value_source": "input", "beta_max": 1.0, "control_dim": 1}),
    ("ddl-write", {"value_channels": 2, "value_source": "input"}),
    ("ddl", {"context": "control", "tied": True, "control_dim": 2}),
    ("ddl-write", {"context": "control", "value_source": "input", "control_dim": 1}),
    ("node", {"adjoint": True}),
    ("node", {"method": "rk4"}),
    ("anode", {"augment_dim": 3, "decoder": "identity"}),
]


def variant_id(variant: tuple[str, dict]) -> str:
    name, options = variant
    return "-".join([name, *(f"{k}={v}" for k, v in options.items())])


def model(name: str, **options) -> DepthModel:
    torch.manual_seed(0)
    return make_model(name, **{**BASE, **options})


def test_list_models_lists_the_vector_families_and_the_transformers():
    transformers = ["ddl-transformer", "ddl-write-transformer", "transformer"]
    assert list_models() == sorted(FAMILIES + transformers)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_check_model_passes(variant):
    name, options = variant
    check_model(model(name, **options))


def test_check_model_finds_a_parameter_without_gradient():
    class Sound(DepthModel):
        def __init__(self, **common):
            super().__init__(**common)
            self.layers = self.per_layer(lambda: nn.Linear(self.state_dim, self.state_dim))

        def step(self, i, state, u_i):
            return state + self.layer(i)(state)

    class Broken(Sound):
        def __init__(self, **common):
            super().__init__(**common)
            self.unused = nn.Parameter(torch.zeros(3))

    check_model(Sound(in_dim=2, out_dim=2, width=4, depth=2))
    with pytest.raises(ValueError, match="unused"):
        check_model(Broken(in_dim=2, out_dim=2, width=4, depth=2))


@pytest.mark.parametrize(
    "variant",
    [
        ("resnet", {}),
        ("gated", {}),
        ("ddl", {}),
        ("ddl", {"value_channels": 4}),
        ("ddl", {"value_source": "input"}),
        ("ddl-write", {"value_channels": 2}),
    ],
    ids=variant_id,
)
def test_gradcheck_one_step(variant):
    name, options = variant
    m = model(name, control_dim=2, **options).double()
    state = torch.randn(3, m.state_dim, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, c: m.step(1, s, c), (state, u))


@pytest.mark.parametrize("name", DISCRETE)
def test_tied_models_share_one_set_of_weights(name):
    shallow, deep = model(name, tied=True, depth=2), model(name, tied=True, depth=16)
    assert count_parameters(shallow) == count_parameters(deep)
    assert len(deep.layers) == 1 and deep.layer(0) is deep.layer(15) is deep.layer(40)
    untied = model(name, depth=16)
    assert count_parameters(untied) > count_parameters(deep)
    assert untied.layer(0).state_dict().keys() == untied.layer(1).state_dict().keys()
    assert untied.layer(0) is not untied.layer(1)


@pytest.mark.parametrize("name", DISCRETE)
def test_untied_models_cannot_extrapolate_and_tied_ones_can(name):
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="untied"):
        model(name)(x, steps=5)
    tied = model(name, tied=True)
    assert tied.can_extrapolate
    assert tied(x, steps=12, per_step=True).shape == (2, 12, 2)
    # the first depth steps of a longer run are the run itself
    torch.testing.assert_close(tied.trajectory(x, steps=12)[:, :5], tied.trajectory(x))


def test_per_step_outputs_decode_the_trajectory():
    m, x = model("ddl"), torch.randn(5, 3)
    traj = m.trajectory(x)
    assert traj.shape == (5, 5, 8)
    torch.testing.assert_close(m(x, per_step=True), m.decode(traj[:, 1:]))
    torch.testing.assert_close(traj[:, 0], m.encoder(x))


@pytest.mark.parametrize("name", FAMILIES)
def test_forward_decodes_the_trajectory_gradients_too(name):
    """`forward` decodes the states as `states` yields them, not a slice of the stacked
    trajectory: the same states bit for bit, and the same outputs and gradients to float
    rounding (the decoder's matmul may round another way on a buffer of another alignment;
    the zeros the slice's backward adds change nothing)."""
    m, x, u = model(name, control_dim=2), torch.randn(5, 3), torch.randn(5, 4, 2)
    states = list(m.states(x, u))
    assert torch.equal(torch.stack(states, dim=1), m.trajectory(x, u))
    params = list(m.parameters())
    for per_step, states_read in ((False, lambda t: t[:, -1]), (True, lambda t: t[:, 1:])):
        direct = m(x, u, per_step=per_step)
        via_stack = m.decode(states_read(m.trajectory(x, u)))
        torch.testing.assert_close(direct, via_stack)
        weights = torch.randn_like(direct)
        for got, want in zip(
            torch.autograd.grad((direct * weights).sum(), params),
            torch.autograd.grad((via_stack * weights).sum(), params),
            strict=True,
        ):
            torch.testing.assert_close(got, want)


def test_controls_change_the_output_and_are_validated():
    m, x = model("resnet", control_dim=2), torch.randn(4, 3)
    u = torch.randn(4, 4, 2)
    assert not torch.allclose(m(x, u), m(x, torch.zeros_like(u)))
    for bad_u, message in [
        (None, "needs controls"),
        (torch.randn(4, 3, 2), "u must be"),
        (torch.randn(4, 4), "u must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            m(x, bad_u, steps=4)
    with pytest.raises(ValueError, match="control_dim=0"):
        model("resnet")(x, u)
    with pytest.raises(ValueError, match="x must be"):
        m(torch.randn(4, 2), u)
    with pytest.raises(ValueError, match="steps"):
        m(x, u, steps=0)


def test_identity_encoder_and_decoder():
    m = model(
        "resnet",
        in_dim=1,
        out_dim=1,
        width=1,
        encoder="identity",
        decoder="identity",
        augment_dim=2,
    )
    x = torch.randn(6, 1)
    traj = m.trajectory(x)
    assert m.state_dim == 3 and traj.shape == (6, 5, 3)
    torch.testing.assert_close(traj[:, 0], torch.cat([x, torch.zeros(6, 2)], dim=1))
    torch.testing.assert_close(m(x), traj[:, -1, :1])
    with pytest.raises(ValueError, match="in_dim == width"):
        model("resnet", encoder="identity")
    with pytest.raises(ValueError, match="identity decoder"):
        model("ddl", out_dim=9, decoder="identity")


def test_resnet_step_is_explicit_euler():
    m, state = model("resnet", step_size=0.1), torch.randn(3, 8)
    torch.testing.assert_close(m.step(2, state, None), state + 0.1 * m.layer(2)(state))


def test_gated_step_is_a_gated_residual():
    m, state = model("gated"), torch.randn(3, 8)
    layer = m.layer(1)
    gate = torch.sigmoid(layer.gate(state))
    torch.testing.assert_close(m.step(1, state, None), state + gate * layer.branch(state))


def randomize_gates(m):
    """Give the gate logits input-dependent weights (they start at zero)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in m.layers:
            layer.branch.out.weight[m.d].normal_(0.0, 2.0)


@pytest.mark.parametrize(
    "options",
    [{}, {"value_channels": 4}, {"value_source": "input", "control_dim": 2}, {"beta_max": 1.0}],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()) or "default",
)
def test_ddl_probe_contracts_the_readout_error(options):
    m = model("ddl", **options)
    randomize_gates(m)
    x = torch.randn(16, 3)
    u = torch.randn(16, 4, 2) if options.get("control_dim") else None
    p = m.probe(x, u)
    d_v = m.value_channels
    assert p.beta.shape == p.k_raw_norm.shape == (16, 4)
    assert p.k.shape == (16, 4, 8 // d_v) and p.v.shape == p.e_post.shape == (16, 4, d_v)
    assert (p.beta > 0).all() and (p.beta < m.beta_max).all()
    assert p.beta.std() > 0.05  # gates now depend on the input
    torch.testing.assert_close(p.e_post, (1 - p.beta[..., None]) * p.e_pre, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(p.e_pre, p.readout - p.v)
    torch.testing.assert_close(p.k.norm(dim=-1), torch.ones(16, 4), atol=1e-4, rtol=0)


@pytest.mark.parametrize("beta_init", [0.1, 1.0, 1.9])
def test_ddl_gate_starts_at_beta_init(beta_init):
    m = model("ddl", beta_init=beta_init)
    x = torch.randn(8, 3)
    torch.testing.assert_close(m.probe(x).beta, torch.full((8, 4), beta_init))
    with torch.no_grad():
        for layer in m.layers:
            layer.branch.out.weight[m.d].normal_(0.0, 1e-4)
    torch.testing.assert_close(m.probe(x).beta, torch.full((8, 4), beta_init), atol=1e-3, rtol=0)


def test_ddl_write_has_no_erase_term():
    delta, write = model("ddl", value_channels=2), model("ddl-write", value_channels=2)
    write.load_state_dict(delta.state_dict())
    state = torch.randn(5, 8)
    k_raw, v, beta = write.generators(2, state, None)
    k, X = normalize_direction(k_raw), write.matrix(state)
    expected = write_update(X, k, v, beta).flatten(-2)
    torch.testing.assert_close(write.step(2, state, None), expected)
    erase = beta[:, None, None] * k[..., None] * torch.einsum("bd,bdv->bv", k, X)[:, None]
    torch.testing.assert_close(delta.step(2, state, None), expected - erase.flatten(-2))


@pytest.mark.parametrize("name", ["ddl", "ddl-write"])
@pytest.mark.parametrize("value_source", ["branch", "input"])
def test_control_context_makes_the_transition_independent_of_the_state(name, value_source):
    """Under context="control" a step is X ← (I − βkkᵀ)X + βkvᵀ with k, v, β functions of u_l
    alone: perturbing the state leaves the generators unchanged (they change under "state")."""
    u = torch.randn(6, 2)
    state, other = torch.randn(6, 8), 10 * torch.randn(6, 8)
    for context in ("control", "state"):
        m = model(name, context=context, control_dim=2, value_source=value_source, value_channels=2)
        randomize_gates(m)
        same = [
            torch.equal(a, b)
            for a, b in zip(m.generators(1, state, u), m.generators(1, other, u), strict=True)
        ]
        assert all(same) if context == "control" else not any(same)
    # so a step is affine in the state: f(x + y) − f(0) = (f(x) − f(0)) + (f(y) − f(0))
    stack = model(name, context="control", control_dim=2, value_channels=2)
    f = {
        key: stack.step(1, x, u)
        for key, x in (
            ("x", state),
            ("y", other),
            ("x+y", state + other),
            ("0", torch.zeros_like(state)),
        )
    }
    torch.testing.assert_close(
        f["x+y"] - f["0"], (f["x"] - f["0"]) + (f["y"] - f["0"]), atol=1e-4, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("ddl", {"value_channels": 0}, "value_channels"),
        ("ddl", {"context": "states"}, "Did you mean 'state'"),
        ("ddl", {"context": "control"}, "control_dim=0"),
        ("ddl", {"beta_max": 2.5}, "beta_max"),
        ("ddl", {"beta_max": 0.0}, "beta_max"),
        ("ddl", {"beta_init": 2.0}, "initial gate"),
        ("ddl-write", {"value_channels": 3}, "not divisible"),
        ("ddl", {"value_source": "inputs"}, "Did you mean 'input'"),
        ("ddl", {"value_chanels": 2}, "Did you mean 'value_channels'"),
        ("resnet", {"step_size": 0.0}, "step_size"),
        ("resnet", {"width": 0}, "width"),
        ("resnet", {"depth": 2.5}, "depth"),
        ("gated", {"encoder": "linar"}, "Did you mean 'linear'"),
        ("gated", {"activation": "relu"}, "activation"),
        ("node", {"method": "dopri_5"}, "Did you mean 'dopri5'"),
        ("node", {"rtol": 0.0}, "rtol"),
        ("anode", {"augment_dim": 0}, "augment_dim"),
    ],
)
def test_bad_configs_raise(name, options, message):
    with pytest.raises(ValueError, match=message):
        model(name, **options)


def test_unknown_model_name_suggests_the_closest():
    with pytest.raises(ValueError, match="Did you mean 'ddl-write'"):
        make_model("ddl_write", **BASE)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"options: .*step_size") as err:
        make_model("resnet", stepsize=0.5, **BASE)
    assert "Did you mean 'step_size'" in str(err.value)


@pytest.mark.parametrize("name", FAMILIES)
def test_match_hidden_matches_resnet_within_ten_percent(name):
    config = {"in_dim": 2, "out_dim": 2, "width": 32, "depth": 8}
    target = count_parameters(make_model("resnet", **config))
    hidden = match_hidden(name, target, **config)
    got = count_parameters(make_model(name, hidden=hidden, **config))
    assert abs(got - target) <= 0.1 * target


def test_match_hidden_rejects_impossible_targets():
    config = {"in_dim": 2, "out_dim": 2, "width": 32, "depth": 8}
    with pytest.raises(ValueError, match="within 10%"):
        match_hidden("resnet", 100, **config)
    with pytest.raises(ValueError, match="hidden"):
        match_hidden("resnet", 10_000, hidden=4, **config)
