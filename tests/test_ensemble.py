"""Seeds trained together: every member of an ensemble ends as its seed does alone, for every
family that folds (the Transformers included), a member that diverges or stops early
included; each twin layer applies each member's own layer to its rows, and a family registers
its layers' twins itself."""

import dataclasses
import inspect
import json
import subprocess
import sys

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment.train import train_seeds
from ddl_dynamics.models.base import Branch
from ddl_dynamics.models.ensemble import (
    TWINS,
    EnsembleBranch,
    EnsembleLinear,
    ensemble_linear,
    fold,
    register_twin,
)
from ddl_dynamics.models.residual import ResNet
from ddl_dynamics.models.transformer_leaves import CausalConv, FloatLinear, Scale

SEEDS = [0, 1, 2]
TINY = {"width": 8, "depth": 3, "hidden": 8}
#: Task specs that take the TINY sizes (1-D sign-flip fixes width = 1).
SPECS = {"sign-flip": {"variant": "reflect"}, "var-chain": {"hops": 2}, "seq-parity": {"length": 8}}


def cells(task="overwrite", model="resnet", options=None, **train):
    data = {
        "seeds": SEEDS,
        "tasks": [{"name": task, "spec": SPECS.get(task, {})}],
        "models": [{"name": model, **(options or {})}],
        "defaults": {
            "model": TINY,
            "train": {
                "steps": 30,
                "n_train": 128,
                "n_test": 64,
                "batch_size": 32,
                "eval_every": 10,
                **train,
            },
        },
    }
    return dd.expand_cells(dd.parse_experiment(data))


def together(group):
    built = [c.build() for c in group]
    return train_seeds(
        built[0][0], [m for _, m in built], [c.train for c in group], [c.seed for c in group]
    )


def one_by_one(group):
    return [dd.train(*c.build(), c.train, c.seed) for c in group]


def leaves(value):
    """Every value in a nested result field with its path, in order."""
    if isinstance(value, dict):
        return [(f"{key}/{p}", v) for key in sorted(value) for p, v in leaves(value[key])]
    if isinstance(value, list | tuple):
        return [(f"{i}/{p}", v) for i, item in enumerate(value) for p, v in leaves(item)]
    return [("", value)]


def assert_close(got, want):
    """Floats equal to float rounding, everything else (names, flags, counts) exactly."""
    got, want = leaves(got), leaves(want)
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, g), (_, w) in zip(got, want, strict=True):
        if isinstance(w, float) and not isinstance(g, bool):
            assert g == pytest.approx(w, rel=1e-4, abs=1e-6, nan_ok=True), path
        else:
            assert g == w, path


def assert_same_run(ensemble, alone):
    """Everything a row records but its cost in time and memory, as when trained alone."""
    assert (ensemble.status, ensemble.message) == (alone.status, alone.message)
    assert ensemble.params == alone.params and ensemble.flops == alone.flops
    assert (ensemble.nfe_forward, ensemble.nfe_backward) == (alone.nfe_forward, alone.nfe_backward)
    skip = {"ensemble", "peak_mem_measure", "reconstruction_error"}
    assert_close(
        {k: v for k, v in ensemble.metrics.items() if k not in skip},
        {k: v for k, v in alone.metrics.items() if k not in skip},
    )
    assert_close(ensemble.curve, alone.curve)
    error = alone.metrics.get("reconstruction_error")
    if error is not None:
        # The 0 → T → 0 round trip's error is the float32 solver's own, which weights equal
        # to rounding move by ~1e-5 (in float64 they agree to 1e-8): a small share of the
        # tolerance it is checked against.
        tolerance = alone.metrics["reconstruction_tolerance"]
        assert abs(ensemble.metrics["reconstruction_error"] - error) < 0.01 * tolerance
    else:
        assert ensemble.metrics.get("reconstruction_error") is None


FAMILIES = [
    ("overwrite", "resnet", {}),
    ("overwrite", "gated", {}),
    ("overwrite", "ddl", {}),
    ("overwrite", "ddl", {"context": "control", "tied": True}),
    ("overwrite", "ddl", {"value_channels": 2, "value_source": "input"}),
    ("overwrite", "ddl-write", {}),
    ("overwrite", "ddl-write", {"context": "control"}),
    ("oscillator", "ddl", {"tied": True}),  # trajectory supervision, the 4x longer split
    ("sign-flip", "node", {"method": "rk4"}),  # a fixed-grid ODE folds too
    ("sign-flip", "anode", {"method": "euler"}),
    ("sign-flip", "node", {}),  # dopri5: each member under its own step-size control
]

#: The Transformer variants (their layers: embedding and tied head, RMSNorms, causal
#: convolutions, channel factors, float32 gates), on sequence tasks.
TRANSFORMERS = [
    ("var-chain", "transformer", {}),
    (
        "var-chain",
        "transformer",
        {"value_channels": 2, "compressor": "token", "compressor_init": "random", "qk_norm": True},
    ),
    ("var-chain", "transformer", {"expansion": "conv"}),
    ("var-chain", "ddl-transformer", {"value_channels": 2, "norm_eps": 1e-5}),
    ("var-chain", "ddl-write-transformer", {"generator": "v-map", "beta_hidden": 4}),
    ("seq-parity", "ddl-transformer", {"value_channels": 2, "expansion": "repeat"}),
]
TRANSFORMER_IDS = [f"{t}-{m}-{'-'.join(map(str, o.values()))}" for t, m, o in TRANSFORMERS]


@pytest.mark.parametrize(
    ("task", "model", "options"),
    FAMILIES,
    ids=[f"{t}-{m}-{'-'.join(map(str, o.values()))}" for t, m, o in FAMILIES],
)
def test_every_seed_of_an_ensemble_ends_as_it_does_alone(task, model, options):
    group = cells(task, model, options)
    ensemble, alone = together(group), one_by_one(group)
    assert [r.metrics["ensemble"] for r in ensemble] == [3, 3, 3]
    assert [r.metrics["ensemble"] for r in alone] == [1, 1, 1]
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)
    # three different seeds (an accuracy may coincide: the training loss tells them apart)
    assert len({(r.metrics["test"], r.curve[-1][1]) for r in ensemble}) == 3


@pytest.mark.parametrize(("task", "model", "options"), TRANSFORMERS, ids=TRANSFORMER_IDS)
def test_a_folded_transformer_step_is_each_members_own(task, model, options):
    """One training step of the folded Transformers, on each member's own batch: every
    member's loss and every gradient equal its own, to float32 rounding."""
    group = cells(task, model, {"heads": 2, **options})
    built = [c.build() for c in group]
    task_, models = built[0][0], [m for _, m in built]
    ensemble = fold(models)
    data = [task_.sample(16, c.seed) for c in group]
    folded = ensemble.module(torch.cat([d.inputs for d in data]))
    losses = [task_.loss(out, d.targets) for out, d in zip(folded.chunk(3), data, strict=True)]
    sum(losses).backward()
    for i, (member, d) in enumerate(zip(models, data, strict=True)):
        own = task_.loss(member(d.inputs), d.targets)
        own.backward()
        torch.testing.assert_close(losses[i], own, rtol=1e-5, atol=0)
        # float32 rounding, at the scale of the whole gradient: a sum over many tokens (an
        # embedding's, a gate bias's) can cancel to an element far below the terms it adds,
        # whose rounding then depends on the order the kernels add in (seen up to ~6 eps of
        # the gradient's norm, on the C++ kernel and the reference backend alike)
        scale = torch.cat([p.grad.flatten() for p in member.parameters()]).norm().item()
        for (name, mine), stack in zip(
            member.named_parameters(), ensemble.module.parameters(), strict=True
        ):
            torch.testing.assert_close(
                stack.grad[i], mine.grad, rtol=1e-4, atol=1e-5 * scale, msg=name
            )


@pytest.mark.parametrize(("task", "model", "options"), TRANSFORMERS, ids=TRANSFORMER_IDS)
def test_every_transformer_seed_ends_as_it_does_alone(task, model, options):
    """Trained together, each seed ends with its own weights and losses: AdamW's state,
    clipping and data are its own. Training amplifies float rounding here (the steps agree
    to 1e-6, above), and an accuracy moves where two logits tie; so losses and weights are
    compared to that amplified rounding, accuracies to two positions in a hundred. The rate
    is 1e-3: at 3e-3 a near-chance seq-parity seed drifts by 1e-2 in 30 steps (AdamW turns
    a rounding-level gradient into a step of up to the rate), which says nothing of whose
    state a member uses."""
    group = cells(task, model, {"heads": 2, **options}, lr=1e-3)
    built = [c.build() for c in group]
    ensemble = train_seeds(
        built[0][0], [m for _, m in built], group[0].train, [c.seed for c in group]
    )
    again = [c.build() for c in group]
    alone = [dd.train(t, m, c.train, c.seed) for (t, m), c in zip(again, group, strict=True)]
    assert [r.metrics["ensemble"] for r in ensemble] == [3, 3, 3]
    for e, a, (_, folded), (_, own) in zip(ensemble, alone, built, again, strict=True):
        assert (e.status, e.params, e.flops, e.metrics["steps"]) == (
            a.status,
            a.params,
            a.flops,
            a.metrics["steps"],
        )
        assert [row[0] for row in e.curve] == [row[0] for row in a.curve]
        for mine, theirs in zip(e.curve, a.curve, strict=True):
            assert mine[1] == pytest.approx(theirs[1], rel=1e-3)  # mean training loss
            assert mine[2] == pytest.approx(theirs[2], abs=0.02)  # val accuracy
        for split in ("train", "val", "test"):
            assert e.metrics[split] == pytest.approx(a.metrics[split], abs=0.02)
        for name, weight in folded.state_dict().items():
            torch.testing.assert_close(weight, own.state_dict()[name], rtol=0, atol=1e-2, msg=name)


def with_configs(group, **changes_of_seed):
    """The group with seed ``s``'s train config changed by ``changes_of_seed[f"s{s}"]``."""
    return [
        dataclasses.replace(
            c, train=dataclasses.replace(c.train, **changes_of_seed.get(f"s{c.seed}", {}))
        )
        for c in group
    ]


@pytest.mark.parametrize("model", ["resnet", "ddl"])
def test_a_diverging_member_is_frozen_and_the_others_go_on(model):
    group = with_configs(cells("overwrite", model), s1={"lr": 1e4, "grad_clip": 0.0})
    ensemble, alone = together(group), one_by_one(group)
    assert [r.status for r in ensemble] == ["ok", "diverged", "ok"]
    assert 0 < ensemble[1].metrics["steps"] < 30 and "loss became" in ensemble[1].message
    assert ensemble[0].metrics["steps"] == ensemble[2].metrics["steps"] == 30
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)


@pytest.mark.parametrize("model", ["resnet", "ddl"])
def test_members_with_their_own_rate_decay_warmup_and_clipping_end_as_alone(model):
    group = with_configs(
        cells("overwrite", model),
        s0={"lr": 1e-2, "weight_decay": 0.1},
        s1={"lr": 3e-4, "warmup": 0.5, "grad_clip": 0.0},
        s2={"grad_clip": 0.05},
    )
    ensemble, alone = together(group), one_by_one(group)
    assert [r.metrics["ensemble"] for r in ensemble] == [3, 3, 3]
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)
    # the configs matter: the same seed at the default config ends elsewhere
    plain = one_by_one(cells("overwrite", model))
    assert all(
        p.metrics["test"] != pytest.approx(a.metrics["test"], rel=1e-3)
        for p, a in zip(plain, alone, strict=True)
    )


def test_members_may_not_differ_in_their_budget():
    group = with_configs(cells("overwrite", "resnet"), s1={"steps": 20})
    built = [c.build() for c in group]
    with pytest.raises(ValueError, match="may differ only in the tunable fields"):
        train_seeds(
            built[0][0], [m for _, m in built], [c.train for c in group], [c.seed for c in group]
        )


def test_a_member_that_reaches_the_target_stops_alone(monkeypatch):
    group = cells("oscillator", "resnet", target_metric=1e3)
    task = group[0].build()[0]
    sample = type(task).sample

    def far_val_for_seed_1(self, n, seed, split="train"):  # its val MSE stays ≈ 1e6
        data = sample(self, n, seed, split)
        if seed == 1 and split == "val":
            return dataclasses.replace(data, targets=data.targets * 1e3)
        return data

    monkeypatch.setattr(type(task), "sample", far_val_for_seed_1)
    ensemble, alone = together(group), one_by_one(group)
    assert [r.metrics["steps"] for r in ensemble] == [10, 30, 10]
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)


def test_adaptive_ode_members_take_their_own_steps_and_count_their_own_nfe():
    group = cells("overwrite", "node", {"horizon": 20.0})
    ensemble, alone = together(group), one_by_one(group)
    assert [r.metrics["ensemble"] for r in ensemble] == [3, 3, 3]
    assert len({r.nfe_forward for r in ensemble}) > 1  # unequal steps in one ensemble
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)


def test_a_member_that_hits_the_solver_cap_does_not_stop_the_others():
    """One member capped in training, one only in its final evaluation's reconstruction
    check (test data: that check alone fails, the cell stays ok), one never: the ensemble
    cannot tell which, so its seeds train one by one, as they end alone."""
    group = cells("overwrite", "anode", {"horizon": 30.0, "max_steps": 3})
    ensemble, alone = together(group), one_by_one(group)
    assert [r.metrics["ensemble"] for r in ensemble] == [1, 1, 1]
    assert [r.status for r in ensemble] == ["ok", "capped", "ok"]
    assert [r.metrics["steps"] for r in ensemble] == [30, 9, 30]
    assert "final evaluation" in ensemble[2].message
    assert set(ensemble[2].metrics["capped"]) == {"reconstruction"}
    for e, a in zip(ensemble, alone, strict=True):
        assert_same_run(e, a)


def test_odes_whose_solve_shares_its_steps_train_one_seed_at_a_time():
    group = cells("sign-flip", "node", {"solver": "torchdiffeq"}, steps=3, eval_every=3, n_test=16)
    ensemble = together(group)
    assert [r.metrics["ensemble"] for r in ensemble] == [1, 1, 1]
    for e, a in zip(ensemble, one_by_one(group), strict=True):
        assert_same_run(e, a)


class BatchMean(ResNet):
    """A stack whose steps subtract the batch mean: samples are not independent."""

    def step(self, i, state, u_i):
        out = super().step(i, state, u_i)
        return out - out.mean(dim=0, keepdim=True)


def test_a_model_that_mixes_its_batch_is_not_folded():
    task = dd.make_task("sign-flip", variant="reflect", depth=TINY["depth"])
    models = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        models.append(BatchMean(in_dim=task.in_dim, out_dim=task.out_dim, **TINY))
    assert fold(models) is not None  # every parameter is in a Linear: it would fold...
    cfg = dd.TrainConfig(steps=5, n_train=64, n_test=32, batch_size=16, eval_every=5)
    results = train_seeds(task, models, cfg, SEEDS)
    assert [r.metrics["ensemble"] for r in results] == [1, 1, 1]  # ...but the check says no


def test_layers_without_a_twin_do_not_fold():
    def norm_model():
        return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4))

    assert fold([norm_model(), norm_model()]) is None
    assert fold([torch.nn.Linear(2, 4)]).module is not None  # one model: itself


def test_models_of_different_architectures_are_refused_in_one_message():
    task = dd.make_task("overwrite", depth=TINY["depth"])
    sizes = {"in_dim": task.in_dim, "out_dim": task.out_dim, **TINY}
    untied, tied = ResNet(**sizes), ResNet(**sizes, tied=True)
    with pytest.raises(ValueError, match="differ in architecture"):
        fold([untied, tied])
    with pytest.raises(ValueError, match="models 0 and 1 differ"):
        fold([torch.nn.Linear(2, 4), torch.nn.Linear(2, 5)])


#: Folds a Transformer in a fresh interpreter, the family's module imported before or after the
#: folding; prints the modules the folding imported on its own and the family's layers and
#: twins in the folded module.
_FOLD_FRESH = """
import json, sys
first = sys.argv[1]
if first == "family":
    from ddl_dynamics.models.transformer import DeltaTransformer
    from ddl_dynamics.models.ensemble import fold
else:
    from ddl_dynamics.models.ensemble import fold
    print(json.dumps(sorted(m for m in sys.modules if m.startswith("ddl_dynamics.models."))))
    from ddl_dynamics.models.transformer import DeltaTransformer
models = [DeltaTransformer(in_dim=9, out_dim=9, width=8, depth=1, value_channels=2)
          for _ in range(2)]
ensemble = fold(models)
print(json.dumps(sorted({type(m).__name__ for m in ensemble.module.modules()}
                        & {"EnsembleFloatLinear", "EnsembleScale", "EnsembleCausalConv",
                           "FloatLinear", "Scale", "CausalConv"})))
"""


@pytest.mark.parametrize("first", ["family", "ensemble"])
def test_a_transformer_folds_whichever_module_is_imported_first(first):
    out = subprocess.run(
        [sys.executable, "-c", _FOLD_FRESH, first], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert json.loads(out[-1]) == ["EnsembleCausalConv", "EnsembleFloatLinear", "EnsembleScale"]
    if first == "ensemble":  # the generic folding loaded no family
        assert json.loads(out[0]) == [
            "ddl_dynamics.models.base",
            "ddl_dynamics.models.ensemble",
            "ddl_dynamics.models.function",
        ]


def test_a_layer_type_has_one_twin():
    register_twin(FloatLinear, TWINS[FloatLinear])  # the same again: a no-op
    with pytest.raises(ValueError, match="FloatLinear already has an ensemble twin"):
        register_twin(FloatLinear, EnsembleLinear)
    assert TWINS[FloatLinear] is not EnsembleLinear


def test_ensemble_linear_applies_each_members_layer_to_its_rows():
    layers = [torch.nn.Linear(3, 2) for _ in range(4)]
    twin = EnsembleLinear(layers)
    x = torch.randn(4 * 5, 7, 3)  # 4 members × 5 rows, an extra axis
    want = torch.cat([layer(part) for layer, part in zip(layers, x.chunk(4), strict=True)])
    torch.testing.assert_close(twin(x), want)
    shared = torch.nn.Linear(2, 2)
    ensemble = fold([torch.nn.Sequential(shared, shared), torch.nn.Sequential(shared, shared)])
    assert ensemble.module[0] is ensemble.module[1]  # a shared layer stays shared


@pytest.mark.parametrize("bias", [True, False])
def test_ensemble_linear_differentiates_as_each_member_and_in_the_weights_layout(bias):
    """Gradients of input, weights and bias against each member's own layer (float64
    gradcheck, twice), and the weights' gradient row-major like the weights, so that
    accumulating it into ``.grad`` copies nothing."""
    g = torch.Generator().manual_seed(int(bias))
    x = torch.randn(3 * 4, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = (x, weight) if b is None else (x, weight, b)

    def layer(x, weight, b=None):
        return ensemble_linear(x, weight, b)

    assert torch.autograd.gradcheck(layer, inputs)
    assert torch.autograd.gradgradcheck(layer, inputs)
    layer(*inputs).square().sum().backward()
    assert weight.grad is not None and weight.grad.stride() == weight.stride()


def test_ensemble_linear_binds_no_signature_outside_torch_func_and_vmaps_inside(monkeypatch):
    """Function.apply binds a setup_context Function's arguments through inspect.signature
    on every call (about 20 µs, a tenth of a folded step); the folded layer skips that,
    and torch.func still transforms it."""
    x, weight, b = torch.randn(2 * 3, 4), torch.randn(2, 5, 4, requires_grad=True), None
    with torch.no_grad():
        want = torch.func.vmap(ensemble_linear, in_dims=(0, None, None))(
            torch.stack([x, 2 * x]), weight, b
        )

    def unbound(*args, **kwargs):
        raise AssertionError("inspect.signature called")

    monkeypatch.setattr(inspect, "signature", unbound)
    ensemble_linear(x, weight, b).sum().backward()
    assert weight.grad is not None
    torch.testing.assert_close(want[1], 2 * ensemble_linear(x, weight, b).detach())


def members(make, count=3):
    """``count`` layers from ``make()``, each with its own perturbed weights."""
    layers = []
    for seed in range(count):
        torch.manual_seed(seed)
        layer = make()
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(0.5 * torch.randn_like(p))
        layers.append(layer)
    return layers


TWIN_CASES = {
    "embedding": (lambda: torch.nn.Embedding(7, 4), lambda: torch.randint(0, 7, (3 * 5, 6))),
    "rmsnorm": (lambda: torch.nn.RMSNorm(4, eps=1e-5), lambda: torch.randn(3 * 5, 6, 4)),
    "scale": (lambda: Scale(torch.ones(2, 4)), lambda: torch.randn(3 * 5, 6, 2, 1)),
    "causal-conv": (lambda: CausalConv(4, 3, outputs=2), lambda: torch.randn(3 * 5, 6, 4)),
    "float-linear": (lambda: FloatLinear(4, 2), lambda: torch.randn(3 * 5, 6, 4)),
}


@pytest.mark.parametrize("case", TWIN_CASES)
def test_each_twin_applies_each_members_layer_to_its_rows(case):
    make, inputs = TWIN_CASES[case]
    layers, x = members(make), inputs()
    twin = TWINS[type(layers[0])](layers)
    want = torch.cat([layer(part) for layer, part in zip(layers, x.chunk(3), strict=True)])
    torch.testing.assert_close(twin(x), want)
    for name, param in twin.named_parameters():
        assert param.shape == (3, *getattr(layers[0], name).shape)  # member axis first


@pytest.mark.parametrize("activation", ["tanh", "silu"])
def test_branch_twin_is_its_two_folded_layers_bit_for_bit(activation):
    """The folded branch, one autograd node where tanh, gives what its two folded layers
    and activation give, values and gradients bit for bit, and each member's own branch."""
    layers = members(lambda: Branch(4, 6, 5, activation))
    x = torch.randn(3 * 7, 4, requires_grad=True)
    twin = EnsembleBranch(layers)
    out = twin(x)
    torch.testing.assert_close(
        out, torch.cat([layer(part) for layer, part in zip(layers, x.chunk(3), strict=True)])
    )
    stacks = (twin.inp.weight, twin.inp.bias, twin.out.weight, twin.out.bias)
    params = [p.detach().clone().requires_grad_() for p in stacks]
    w1, b1, w2, b2 = params
    y = x.detach().clone().requires_grad_()
    want = ensemble_linear(twin.act(ensemble_linear(y, w1, b1)), w2, b2)
    assert torch.equal(out, want)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *stacks], g)
    for a, b in zip(got, torch.autograd.grad(want, [y, *params], g), strict=True):
        assert torch.equal(a, b)


def test_tanh_branch_twin_differentiates_twice_and_vmaps():
    layers = [layer.double() for layer in members(lambda: Branch(3, 4, 2))]
    twin = EnsembleBranch(layers)
    x = torch.randn(3 * 2, 3, dtype=torch.float64, requires_grad=True)
    names = ["inp.weight", "inp.bias", "out.weight", "out.bias"]
    params = tuple(twin.get_parameter(name) for name in names)

    def branch(x, *weights):
        return torch.func.functional_call(twin, dict(zip(names, weights, strict=True)), x)

    assert torch.autograd.gradcheck(branch, (x, *params))
    assert torch.autograd.gradgradcheck(branch, (x, *params))
    with torch.no_grad():
        got = torch.func.vmap(twin, in_dims=0)(torch.stack([x, 2 * x]))
        torch.testing.assert_close(got[1], twin(2 * x))


def test_gate_twin_computes_in_float32_on_bfloat16_weights():
    layers = [layer.to(torch.bfloat16) for layer in members(lambda: FloatLinear(4, 1))]
    x = torch.randn(3 * 5, 4, dtype=torch.bfloat16)
    twin = TWINS[FloatLinear](layers)
    out = twin(x)
    want = torch.cat([layer(part) for layer, part in zip(layers, x.chunk(3), strict=True)])
    assert out.dtype == want.dtype == torch.float32
    torch.testing.assert_close(out, want)


def test_a_tied_head_stays_tied_in_the_ensemble():
    models = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        models.append(dd.make_model("transformer", in_dim=9, out_dim=9, width=8, depth=1))
    ensemble = fold(models)
    module = ensemble.module
    assert module.head.weight is module.embed.weight
    assert len(ensemble.slots) == len(list(module.parameters()))  # each stack once
    with torch.no_grad():
        module.embed.weight[1].add_(1.0)
    tied = ensemble.export(1)
    assert tied.head.weight is tied.embed.weight
    torch.testing.assert_close(tied.embed.weight, module.embed.weight[1])
