"""The Householder-product Delta block (``ddl-transformer`` with ``product`` n_h > 1): n_h
delta updates per sublayer, each with its own k, v, β from one sublayer pass. ``product = 1``
is the block as it was; n_h = 2 against dense d × d matrices by hand; gradients, folding,
the compile-only forms, probes, parameter matching, FLOPs, cell keys and bad options."""

import dataclasses

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics import count_parameters, make_model, make_task
from ddl_dynamics.experiment.config import Cell
from ddl_dynamics.models.ensemble import fold
from ddl_dynamics.models.flops import flop_counter
from ddl_dynamics.models.operator import delta_update, write_update
from ddl_dynamics.models.params import match_hidden
from ddl_dynamics.models.transformer_delta import DeltaResidual, Generators

VOCAB, WIDTH, DEPTH, T = 11, 16, 2, 7
BASE = {"in_dim": VOCAB, "out_dim": VOCAB, "width": WIDTH, "depth": DEPTH, "heads": 2}
#: Variants of the block that a product must reach: d_v = 1 and > 1 (CC, TC, EC), v-Map, the
#: two-layer gate, a constant target, and the write-only twin.
VARIANTS = [
    ("ddl-transformer", {}),
    ("ddl-transformer", {"value_channels": 4}),
    (
        "ddl-transformer",
        {
            "value_channels": 2,
            "compressor": "token",
            "compressor_init": "random",
            "qk_norm": True,
            "norm_eps": 1e-5,
        },
    ),
    ("ddl-transformer", {"generator": "v-map", "value_channels": 2, "beta_hidden": 4}),
    ("ddl-transformer", {"value": "constant", "beta_init": 0.5}),
    ("ddl-write-transformer", {"value_channels": 2}),
]
IDS = ["-".join([name, *(f"{k}={v}" for k, v in options.items())]) for name, options in VARIANTS]


def model(name: str = "ddl-transformer", seed: int = 0, **options) -> torch.nn.Module:
    return make_model(name, seed=seed, **{**BASE, **options})


def scrambled(module: torch.nn.Module, seed: int = 5) -> torch.nn.Module:
    """``module`` with every parameter perturbed: gates, targets and kernels off their init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def tokens(batch: int = 3, length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_product_one_is_the_block_weight_for_weight():
    """``product = 1`` builds the block as before: the same parameters (names, shapes,
    values from the same seed), the same outputs to the bit, one gate and one target per
    sublayer, and the update written out by hand."""
    plain, one = scrambled(model()), scrambled(model(product=1))
    assert plain.state_dict().keys() == one.state_dict().keys()
    for name, weight in plain.state_dict().items():
        assert torch.equal(weight, one.state_dict()[name]), name
    x = tokens()
    assert torch.equal(plain(x), one(x))
    residual = one.blocks[0].residuals[0]
    assert {n: tuple(p.shape) for n, p in residual.named_parameters()} == {
        "gate.0.weight": (1, WIDTH),
        "gate.0.bias": (1,),
        "value.weight": (1, WIDTH),
        "value.bias": (1,),
    }
    assert one.blocks[0].sublayers[1].out.weight.shape == (WIDTH, 8 * WIDTH // 3)
    assert one.probe(x).update is None and one.probe(x).beta.shape == (3, T, 2 * DEPTH)
    block = one.blocks[0]
    X = torch.randn(2, T, 1, WIDTH)
    x_in, c, h = block.process(0, X)
    k = h / torch.sqrt(h.square().sum(-1, keepdim=True) + 1e-10)
    beta = 2 * torch.sigmoid(c @ residual.gate[0].weight.T + residual.gate[0].bias)
    v = 4 * torch.sigmoid(x_in @ residual.value.weight.T + residual.value.bias)
    want = X[:, :, 0] + beta * k * (v - (k * X[:, :, 0]).sum(-1, keepdim=True))
    torch.testing.assert_close(residual(X, x_in, c, h)[:, :, 0], want, atol=1e-5, rtol=1e-5)


def dense_sublayer(
    residual: DeltaResidual, X: torch.Tensor, x_in: torch.Tensor, c: torch.Tensor, h: torch.Tensor
) -> torch.Tensor:
    """The residual update of one sublayer by hand, with explicit d × d matrices: for each
    update in turn, ``X ← (I − β_h k_h k_hᵀ) X + β_h k_h v_hᵀ`` (write-only: ``X + β_h k_h
    v_hᵀ``), its ``k̃_h``, gate and target read from the h-th slice of each map's output."""
    spec, n, d, d_v = residual.spec, residual.spec.product, X.shape[-1], X.shape[-2]
    gate = residual.gate[-1]
    hidden = c if len(residual.gate) == 1 else torch.tanh(c @ residual.gate[0].weight.T)
    logits = hidden @ gate.weight.T + gate.bias  # (B, T, n)
    if spec.generator == "v-map":
        directions, values = c @ residual.direction.weight.T, h
    else:
        directions, values = h, x_in
    M = X.mT  # (B, T, d, d_v)
    eye = torch.eye(d, dtype=X.dtype)
    for j in range(n):
        k_raw = directions[..., j * d : (j + 1) * d]
        k = k_raw / torch.sqrt(k_raw.square().sum(-1, keepdim=True) + 1e-10)
        beta = spec.beta_max * torch.sigmoid(logits[..., j])[..., None, None]
        if residual.value is None:
            v = torch.full((*X.shape[:2], d_v), spec.value_scale / 2, dtype=X.dtype)
        else:
            weight = residual.value.weight[j * d_v : (j + 1) * d_v]
            v = 4 * torch.sigmoid(values @ weight.T + residual.value.bias[j * d_v : (j + 1) * d_v])
        outer = k[..., :, None] * k[..., None, :]  # k kᵀ, (B, T, d, d)
        erase = eye - beta * outer if residual.update is delta_update else eye + 0 * outer
        M = erase @ M + beta * k[..., :, None] * v[..., None, :]
    return M.mT


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_product_two_equals_the_dense_householder_updates_by_hand(name, options):
    """Every sublayer of a scrambled float64 block at n_h = 2 against `dense_sublayer`; the
    second update changes what the first alone gives."""
    m = scrambled(model(name, product=2, **options)).double()
    block = m.blocks[0]
    d_v = options.get("value_channels", 1)
    X = torch.randn(2, T, d_v, WIDTH, dtype=torch.float64)
    for i, residual in enumerate(block.residuals):
        x_in, c, h = block.process(i, X)
        assert h.shape[-1] == (WIDTH if options.get("generator") == "v-map" else 2 * WIDTH)
        want = dense_sublayer(residual, X, x_in, c, h)
        got = residual(X, x_in, c, h)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        k_raw, v, beta = residual.generators(x_in, c, h)
        k = k_raw[..., 0, :] / torch.sqrt(k_raw[..., 0, :].square().sum(-1, keepdim=True) + 1e-10)
        first = residual.update(X.mT, k, v[..., 0, :], beta[..., 0]).mT
        assert not torch.allclose(got, first)
        X = got


def test_the_product_update_passes_gradcheck_in_float64():
    """The n_h = 2 residual update's closed-form backward (through the operator's autograd
    Function, twice in turn) against finite differences, in X, x_in, c and h."""
    torch.manual_seed(0)
    for update, d_v in ((delta_update, 2), (write_update, 1), (delta_update, 1)):
        residual = scrambled(DeltaResidual(update, 4, d_v, Generators(product=2))).double()
        shapes = ((1, 2, d_v, 4), (1, 2, 4), (1, 2, 4), (1, 2, 8))
        inputs = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
        assert torch.autograd.gradcheck(residual, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_folded_product_blocks_compute_each_members_own(name, options):
    """Three seeds folded into one module: on each member's rows the folded forward is the
    member's own, and so is every gradient, to float32 rounding."""
    members = [scrambled(model(name, seed=s, product=2, **options), seed=s) for s in range(3)]
    ensemble = fold(members)
    assert ensemble is not None and ensemble.size == 3
    xs = [tokens(seed=s) for s in range(3)]
    folded = ensemble.module(torch.cat(xs))
    folded.square().mean(dim=(1, 2)).sum().backward()
    for i, (member, x) in enumerate(zip(members, xs, strict=True)):
        own = member(x)
        torch.testing.assert_close(folded[3 * i : 3 * (i + 1)], own, rtol=1e-5, atol=1e-5)
        own.square().mean(dim=(1, 2)).sum().backward()
        # float32 rounding at the scale of the whole gradient (sums over many tokens cancel)
        scale = torch.cat([p.grad.flatten() for p in member.parameters()]).norm().item()
        for (pname, mine), stack in zip(
            member.named_parameters(), ensemble.module.parameters(), strict=True
        ):
            torch.testing.assert_close(
                stack.grad[i], mine.grad, rtol=1e-4, atol=1e-5 * scale, msg=pname
            )


@pytest.mark.parametrize("value_channels", [1, 4])
def test_the_compile_only_forms_compute_what_eager_does(monkeypatch, value_channels):
    """Under ``torch.compile`` the update runs as the registered op and short sequences attend
    by broadcast products; forced eagerly (``is_compiling``), n_h = 2 computes the same
    values and gradients."""
    m = scrambled(model(product=2, value_channels=value_channels, qk_norm=True)).double()
    x = tokens()

    def run():
        m.zero_grad()
        out = m(x)
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in m.parameters()]

    eager = run()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    compiled = run()
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-10, atol=1e-10)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.slow  # compiling takes 20-40 s cold
def test_compiled_product_steps_agree_with_eager_ones_from_the_same_init():
    """The trainer's folded step through ``torch.compile``, n_h = 2 at d_v = 2 with the
    released block's options: the same losses and weights as eager steps."""
    from ddl_dynamics.experiment import step as step_module
    from ddl_dynamics.experiment.batches import fold_data
    from ddl_dynamics.experiment.config import TrainConfig
    from ddl_dynamics.experiment.optim import make_optimizer
    from ddl_dynamics.experiment.step import training_step

    task = make_task("swap-track", swaps=4)

    def steps(compile: bool) -> tuple[list[float], torch.Tensor]:
        members = [
            make_model(
                "ddl-transformer",
                in_dim=task.in_dim,
                out_dim=task.out_dim,
                width=8,
                depth=1,
                heads=2,
                qk_norm=True,
                norm_eps=1e-5,
                compressor_init="random",
                value_channels=2,
                product=2,
                seed=s,
            )
            for s in range(2)
        ]
        ensemble = fold(members)
        batch = fold_data([task.sample(8, s, "train") for s in range(2)])
        optimizer, cfg = make_optimizer(ensemble.module), TrainConfig(steps=10, compile=compile)
        losses = [training_step(ensemble, optimizer, task, batch, cfg, i) for i in range(3)]
        weights = torch.cat([p.detach().reshape(2, -1) for p in ensemble.module.parameters()], 1)
        return losses, weights

    eager, compiled = steps(False), steps(True)
    assert step_module.compiled_losses.losses is not None and not step_module.compiled_losses.failed
    torch.testing.assert_close(
        torch.tensor(compiled[0]), torch.tensor(eager[0]), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["ddl-transformer", "ddl-write-transformer"])
@pytest.mark.parametrize("value_channels", [1, 2])
def test_the_probe_has_one_row_per_update(name, value_channels):
    """``2 · depth · n_h`` rows, sublayer-major then update, marked by ``update``; each row's
    gate is its update's own, each row an exact update (``e_post = (1 − β) e_pre``, or
    ``e_pre + β v`` writing only), chained: a row's state after is the next row's before."""
    n = 3
    m = scrambled(model(name, product=n, value_channels=value_channels))
    x = tokens()
    probe = m.probe(x)
    S = 2 * DEPTH * n
    assert probe.beta.shape == (3, T, S) and probe.k.shape == (3, T, S, WIDTH)
    assert probe.v.shape == probe.e_pre.shape == (3, T, S, value_channels)
    assert probe.update.tolist() == [0, 1, 2] * (2 * DEPTH)
    passes = list(m.passes(x))
    gates = torch.cat([p.residual.generators(p.x_in, p.c, p.h)[2] for p in passes], dim=-1)
    torch.testing.assert_close(probe.beta, gates)  # sublayer-major, then update
    assert not torch.allclose(probe.beta[..., 0::n], probe.beta[..., 1::n])
    torch.testing.assert_close(probe.k.norm(dim=-1), torch.ones(3, T, S), atol=1e-5, rtol=0)
    if name == "ddl-transformer":
        ratio = probe.e_post.norm(dim=-1) / probe.e_pre.norm(dim=-1)
        torch.testing.assert_close(ratio, (1 - probe.beta).abs(), atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(
            probe.e_post, probe.e_pre + probe.beta[..., None] * probe.v, atol=1e-4, rtol=1e-4
        )


def test_the_product_trains_with_gates_starting_at_beta_init():
    """Every update's gate starts at ``beta_init`` (capped by ``beta_max``) for a zero
    context, and every parameter gets a gradient."""
    m = model(product=2, beta_init=0.4, beta_max=1.0, value_channels=2)
    zero = torch.zeros(1, 2, WIDTH)
    for block in m.blocks:
        for residual in block.residuals:
            _, v, beta = residual.generators(zero, zero, torch.zeros(1, 2, 2 * WIDTH))
            torch.testing.assert_close(beta, torch.full((1, 2, 2), 0.4))
            assert v.shape == (1, 2, 2, 2)
    m(tokens()).square().mean().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("value_channels", [1, 4])
def test_parameters_match_the_baseline_within_one_percent(value_channels):
    """At swap-track's size (width 32, 4 blocks, 2 heads, the released block's options) the
    MLP size found for n_h = 2 brings the parameter count within 1% of the baseline's."""
    task = make_task("swap-track", swaps=5)
    size = {
        "in_dim": task.in_dim,
        "out_dim": task.out_dim,
        "width": 32,
        "depth": 4,
        "heads": 2,
        "qk_norm": True,
        "norm_eps": 1e-5,
        "compressor_init": "random",
    }
    target = count_parameters(make_model("transformer", **size))
    options = {**size, "value_channels": value_channels}
    single = match_hidden("ddl-transformer", target, **options)
    hidden = match_hidden("ddl-transformer", target, product=2, **options)
    got = count_parameters(make_model("ddl-transformer", hidden=hidden, product=2, **options))
    assert abs(got / target - 1) < 0.01 and hidden < single


def test_parameter_count_of_the_product_by_hand():
    """n_h = 2 adds, per block, a second d-wide slice of both output projections and, per
    sublayer, a second gate row and target map."""
    d, hidden, d_v = WIDTH, 8 * WIDTH // 3, 2
    for generator, extra_block in (("k-map", d * d + hidden * d), ("v-map", 0)):
        one = count_parameters(model(generator=generator, value_channels=d_v))
        two = count_parameters(model(generator=generator, value_channels=d_v, product=2))
        per_sublayer = (d + 1) + (d + 1) * d_v + (d * d if generator == "v-map" else 0)
        assert two - one == DEPTH * (extra_block + 2 * per_sublayer), generator


def test_flops_count_every_update():
    """Forward FLOPs per token of n_h = 2 over n_h = 1 at the same size: the second slices of
    both output projections, of the gate and target maps, and the second update
    (``4 · d · d_v``)."""
    d, hidden, d_v, L = WIDTH, 8 * WIDTH // 3, 2, T

    def flops(product: int) -> int:
        with flop_counter() as counter:
            model(product=product, value_channels=d_v)(tokens(batch=1))
        return counter.get_total_flops()

    one, two = flops(1), flops(2)
    per_block = 2 * d * d + 2 * hidden * d + 2 * (2 * d + 2 * d * d_v + 4 * d * d_v)
    assert two > one and two - one == L * DEPTH * per_block


@pytest.mark.parametrize("product", [0, -1, 1.5, True, "2"])
def test_a_bad_product_fails_with_one_clear_message(product):
    with pytest.raises(ValueError, match="product must be an integer >= 1"):
        model(product=product)


@pytest.mark.parametrize("name", ["ddl-transformer", "ddl-write-transformer"])
def test_a_cell_of_product_one_keeps_the_key_it_had_before_the_option(name):
    before = Cell(
        task="swap-track",
        task_label="swap-track",
        spec={},
        model=name,
        label=name,
        config={"width": WIDTH, "beta_init": 1.0},
        train=dd.TrainConfig(),
        seed=0,
    )
    one = dataclasses.replace(before, config={**before.config, "product": 1})
    two = dataclasses.replace(before, config={**before.config, "product": 2})
    assert one.key == before.key and "product" not in one.to_dict()["config"]
    assert two.key != before.key and two.to_dict()["config"]["product"] == 2
    assert Cell.from_dict(two.to_dict()) == two
