"""The Transformer families: causality, the Delta block (k-Map and v-Map) and QK-norm against
hand computations, the expanded state's expansion and compressors, the released code's
options, every dtype, parameter counts, probes and bad options."""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ddl_dynamics import (
    ExperimentConfig,
    count_parameters,
    expand_cells,
    load_experiment,
    make_model,
    make_task,
)
from ddl_dynamics.models.attention import Attention, broadcast_attention, rope_tables, rotary
from ddl_dynamics.models.expanded_state import ChannelCompressor, ConvExpansion, TokenCompressor
from ddl_dynamics.models.flops import flop_counter
from ddl_dynamics.models.params import match_hidden
from ddl_dynamics.models.transformer import _AddResidual
from ddl_dynamics.models.transformer_leaves import CausalConv, causal_conv

VOCAB, WIDTH, DEPTH, T = 11, 16, 2, 9
BASE = {"in_dim": VOCAB, "out_dim": VOCAB, "width": WIDTH, "depth": DEPTH, "heads": 2}

VARIANTS = [
    ("transformer", {}),
    ("transformer", {"value_channels": 4}),
    ("transformer", {"value_channels": 4, "compressor": "token", "expansion": "repeat"}),
    ("ddl-transformer", {}),
    ("ddl-transformer", {"beta_hidden": 8, "value": "linear", "value_input": "context"}),
    ("ddl-transformer", {"value": "constant", "beta_init": 0.5}),
    ("ddl-transformer", {"value_channels": 4}),
    ("ddl-transformer", {"value_channels": 4, "compressor": "token"}),
    ("ddl-transformer", {"value_channels": 3, "expansion": "repeat", "kernel_size": 2}),
    ("ddl-write-transformer", {}),
    ("ddl-write-transformer", {"value_channels": 4, "compressor": "token"}),
    ("transformer", {"expansion": "conv"}),  # EC without the expanded state
    ("ddl-transformer", {"expansion": "conv", "kernel_size": 3}),
    ("ddl-transformer", {"generator": "v-map"}),
    ("ddl-transformer", {"generator": "v-map", "value_channels": 4, "value": "linear"}),
    ("ddl-write-transformer", {"generator": "v-map", "beta_hidden": 4}),
    ("transformer", {"qk_norm": True, "norm_eps": 1e-5}),
    (
        "ddl-transformer",
        {"value_channels": 4, "qk_norm": True, "norm_eps": 1e-5, "compressor_init": "random"},
    ),
    ("ddl-transformer", {"value_channels": 2, "compressor": "token", "compressor_init": "random"}),
]


def variant_id(variant: tuple[str, dict]) -> str:
    name, options = variant
    return "-".join([name, *(f"{k}={v}" for k, v in options.items())])


def model(name: str, seed: int = 0, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make_model(name, **{**BASE, **options})


def scrambled(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every parameter perturbed: identity-initialised kernels then look
    at past tokens too, so causality is tested on weights that could break it."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def tokens(batch: int = 3, length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_causal_and_runs_longer_sequences(variant):
    name, options = variant
    m = scrambled(model(name, **options))
    x = tokens()
    out = m(x)
    assert out.shape == (3, T, VOCAB) and torch.isfinite(out).all()
    for t in (0, 4, T - 1):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1) % VOCAB
        again = m(changed)
        assert torch.equal(again[:, :t], out[:, :t]), f"token {t} changed an earlier output"
        assert not torch.allclose(again[:, t], out[:, t])
    assert m(tokens(length=4 * T)).shape == (3, 4 * T, VOCAB)  # RoPE: any length
    assert torch.equal(m(x, per_step=False), out[:, -1])


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_gradients_reach_every_parameter(variant):
    name, options = variant
    m = model(name, **options)
    m(tokens()).square().mean().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} gets a zero gradient"


def test_scalar_block_equals_the_update_by_hand():
    """d_v = 1: x + βk(v − kᵀx) per sublayer with k = h/sqrt(‖h‖² + ε²), β = 2σ(w·c + b)
    in float32 and v = 4σ(w_v·x + b_v) from the residual stream, written out here."""
    m = scrambled(model("ddl-transformer", beta_init=0.7))
    block = m.blocks[0]
    x = torch.randn(2, T, WIDTH)
    expect = x
    for i in range(2):
        norm, sublayer, residual = block.norms[i], block.sublayers[i], block.residuals[i]
        eps = torch.finfo(torch.float32).eps  # nn.RMSNorm's default
        c = expect * torch.rsqrt(expect.square().mean(-1, keepdim=True) + eps) * norm.weight
        h = sublayer(c)
        k = h / torch.sqrt(h.square().sum(-1, keepdim=True) + 1e-10)
        gate, value = residual.gate[0], residual.value
        beta = 2 * torch.sigmoid(c @ gate.weight.T + gate.bias)  # (B, T, 1)
        v = 4 * torch.sigmoid(expect @ value.weight.T + value.bias)  # (B, T, 1)
        readout = (k * expect).sum(-1, keepdim=True)
        expect = expect + beta * k * (v - readout)
    got = block(x.unsqueeze(-2)).squeeze(-2)  # (B, T, d_v = 1, d)
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, x + 0.0)


def test_v_map_block_equals_the_update_by_hand():
    """v-Map: k̃ = W_k c from the context, v = 4σ(W_v h + b_v) from the sublayer output, with
    the released RMSNorm eps; the gate as in k-Map."""
    m = scrambled(model("ddl-transformer", generator="v-map", value_channels=2, norm_eps=1e-5))
    block = m.blocks[0]
    X = torch.randn(2, T, 2, WIDTH)  # channels first
    expect = X
    for i in range(2):
        norm, sublayer, residual = block.norms[i], block.sublayers[i], block.residuals[i]
        x_in = (expect * block.compress.mix.weight).sum(-2)
        c = x_in * torch.rsqrt(x_in.square().mean(-1, keepdim=True) + 1e-5) * norm.weight
        h = sublayer(c)
        k_raw = c @ residual.direction.weight.T
        k = k_raw / torch.sqrt(k_raw.square().sum(-1, keepdim=True) + 1e-10)
        gate = residual.gate[0]
        beta = 2 * torch.sigmoid(c @ gate.weight.T + gate.bias)[..., None]  # (B, T, 1, 1)
        v = 4 * torch.sigmoid(h @ residual.value.weight.T + residual.value.bias)  # (B, T, 2)
        readout = torch.einsum("btd,btvd->btv", k, expect)
        expect = expect + beta * (v - readout)[..., None] * k[..., None, :]
    torch.testing.assert_close(block(X), expect, atol=1e-5, rtol=1e-5)


def test_qk_norm_normalises_each_heads_queries_and_keys_after_rope():
    """softmax(q̂ k̂ᵀ / √hd) v with q̂ = g_q ⊙ q / rms(q) after RoPE (and k̂ likewise), the
    attention of the authors' released block; a scale of the query weights then changes
    nothing."""
    heads, hd = 2, WIDTH // 2
    attention = scrambled(Attention(WIDTH, heads, hd, 10000.0, qk_norm=True, eps=1e-5))
    c = torch.randn(2, T, WIDTH)
    q, k, v = (c @ attention.qkv.weight.T).view(2, T, 3, heads, hd).permute(2, 0, 3, 1, 4)

    def normed(x, gain):
        x = rotary(x, 10000.0)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * gain

    q, k = normed(q, attention.q_norm.weight), normed(k, attention.k_norm.weight)
    scores = (q @ k.mT) / hd**0.5 + torch.full((T, T), float("-inf")).triu(1)
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, T, WIDTH)
    torch.testing.assert_close(attention(c), y @ attention.out.weight.T, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        attention.qkv.weight[:WIDTH] *= 7.0  # the queries' rows
    torch.testing.assert_close(attention(c), y @ attention.out.weight.T, atol=1e-4, rtol=1e-4)
    plain = Attention(WIDTH, heads, hd, 10000.0, qk_norm=False, eps=None)
    plain.load_state_dict(attention.state_dict(), strict=False)
    assert not torch.allclose(plain(c), attention(c), atol=1e-3)


def test_released_options_set_every_norm_and_draw_the_compressors():
    m = model(
        "ddl-transformer",
        value_channels=4,
        norm_eps=1e-5,
        qk_norm=True,
        compressor_init="random",
        width=64,
        heads=4,
    )
    norms = [mod for mod in m.modules() if isinstance(mod, torch.nn.RMSNorm)]
    assert len(norms) == DEPTH * 4 + 1 and all(n.eps == 1e-5 for n in norms)  # 2 + QK per block
    assert all(
        n.eps is None for n in model("transformer").modules() if isinstance(n, torch.nn.RMSNorm)
    )
    weights = torch.cat([b.compress.mix.weight.flatten() for b in m.blocks])
    assert abs(weights.std().item() / (0.5 / 64**0.5) - 1) < 0.15 and abs(weights.mean()) < 0.02
    mean = model("ddl-transformer", value_channels=4, width=64, heads=4)
    assert torch.equal(mean.blocks[0].compress.mix.weight, torch.full((4, 64), 0.25))
    token = model(
        "ddl-transformer",
        value_channels=4,
        compressor="token",
        compressor_init="random",
        width=64,
        heads=4,
    )
    kernel = token.blocks[0].compress.conv.weight  # (K, 1, d·d_v)
    assert kernel[:-1].abs().sum() > 0 and abs(kernel.std().item() * 8 - 0.5) < 0.1
    torch.testing.assert_close(token.blocks[0].compress.read.weight, torch.full((4,), 0.25))


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.bfloat16],
    ids=lambda t: str(t).removeprefix("torch."),
)
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_every_variant_trains_in_every_dtype(variant, dtype):
    """Weights and state in ``dtype``, forward and backward on the CPU; the gates are
    computed in at least float32 (float64 in a float64 model)."""
    name, options = variant
    m = scrambled(model(name, **options)).to(dtype)
    out = m(tokens())
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert all(
        p.grad is not None and p.grad.dtype == dtype and torch.isfinite(p.grad).all()
        for p in m.parameters()
    )
    if hasattr(m, "probe"):
        assert m.probe(tokens()).beta.dtype == torch.promote_types(dtype, torch.float32)
    wide = m.to(torch.float32)(tokens())  # the same function, to the dtype's rounding:
    if dtype == torch.float64:  # elementwise
        torch.testing.assert_close(out.float(), wide, atol=1e-3, rtol=1e-3)
    else:  # bf16 keeps 8 bits: on average
        assert (out.float() - wide).abs().mean() < 0.05 * wide.abs().mean()


def test_gates_start_at_beta_init_and_a_constant_target():
    m = model("ddl-transformer", beta_init=0.3, value="constant", value_scale=3.0)
    zero = torch.zeros(1, 2, WIDTH)
    for block in m.blocks:
        for residual in block.residuals:
            _, v, beta = residual.generators(zero, zero, zero)
            assert beta.dtype == torch.float32
            torch.testing.assert_close(beta, torch.full((1, 2), 0.3))
            torch.testing.assert_close(v, torch.full((1, 2, 1), 1.5))


@pytest.mark.parametrize("repeat", [1, 3])
def test_causal_conv_is_a_grouped_conv1d_over_past_tokens(repeat):
    """Against torch's grouped convolution, left-padded, whose output channel ``c·R + r``
    is output ``(r, c)`` here; with a member axis, each member's kernel on its own rows."""
    x, conv1d = torch.randn(2, T, 5), torch.randn(5 * repeat, 1, 3)
    weight = conv1d.view(5, repeat, 3).permute(2, 1, 0)  # (K, R, C)
    want = F.conv1d(F.pad(x.transpose(1, 2), (2, 0)), conv1d, groups=5).transpose(1, 2)
    want = want.unflatten(-1, (5, repeat)).transpose(-1, -2)  # (B, T, R, C)
    torch.testing.assert_close(causal_conv(x, weight), want)
    kernels = torch.stack([weight, 2 * weight])
    torch.testing.assert_close(
        causal_conv(torch.stack([x, x]), kernels), torch.stack([want, 2 * want])
    )


@pytest.mark.parametrize("channels", [1, 4])
def test_expansion_conv_at_init_equals_repetition(channels):
    expand = ConvExpansion(WIDTH, channels, kernel_size=3)
    x = torch.randn(2, T, WIDTH)
    assert torch.equal(expand(x), x.unsqueeze(-2).expand(2, T, channels, WIDTH))
    scrambled(expand)
    assert not torch.allclose(expand(x), x.unsqueeze(-2).expand(2, T, channels, WIDTH))


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("transformer", {"value_channels": 4}),
        (
            "ddl-transformer",
            {"value_channels": 4, "compressor": "token", "compressor_init": "random"},
        ),
    ],
)
def test_weights_saved_in_the_coordinate_major_layout_load_as_the_same_function(name, options):
    """Weights saved before the state was held channels first (0.1's run folders: a plain dict,
    no layout versions; causal kernels in conv1d's ``(C·R, 1, K)``, channel mixing
    ``(d, d_v)``, additive writes ``(d_v,)``) load into today's layers as the function they
    were; today's state dict, which carries its versions, loads as it is."""
    m = scrambled(model(name, **options))
    saved = m.state_dict()
    old = dict(saved)
    for prefix, layer in m.named_modules():
        key = f"{prefix}." if prefix else ""
        if isinstance(layer, CausalConv):
            K, R, C = layer.weight.shape
            old[key + "weight"] = saved[key + "weight"].permute(2, 1, 0).reshape(C * R, 1, K)
        elif isinstance(layer, ChannelCompressor):
            old[key + "mix.weight"] = saved[key + "mix.weight"].mT.contiguous()
        elif isinstance(layer, _AddResidual) and layer.write is not None:
            old[key + "write.weight"] = saved[key + "write.weight"].squeeze(-1)
    x = tokens()
    for state in (old, saved):
        loaded = model(name, **options)
        loaded.load_state_dict(state)
        torch.testing.assert_close(loaded(x), m(x))


def test_token_compressor_reads_a_short_causal_history():
    compress = scrambled(TokenCompressor(WIDTH, 4, kernel_size=3, init="mean"))
    X = torch.randn(2, T, 4, WIDTH)
    out = compress(X)
    changed = X.clone()
    changed[:, 4] += 1.0
    moved = (compress(changed) - out).abs().amax(dim=(0, 2))  # per token
    assert moved[:4].eq(0).all(), "a later token changed an earlier compressed input"
    assert (moved[4:7] > 0).all(), "tokens t .. t + K − 1 read token t"
    assert moved[7:].eq(0).all(), "the kernel reaches further back than K − 1 tokens"


def test_expanded_additive_control_starts_as_the_baseline():
    """With repeated channels, mean compression and w = 1, d_v = 4 computes what d_v = 1
    computes with the same weights: the control differs only once training moves it; so
    does EC at d_v = 1, identity-initialised."""
    base = scrambled(model("transformer"))
    for options in (
        {"value_channels": 4, "expansion": "repeat"},
        {"value_channels": 4, "expansion": "conv"},
        {"expansion": "conv"},
    ):
        wide = model("transformer", **options)
        missing = wide.load_state_dict(base.state_dict(), strict=False).missing_keys
        assert missing and all(k.endswith("weight") for k in missing)
        torch.testing.assert_close(wide(tokens()), base(tokens()), atol=1e-5, rtol=1e-5)


def test_parameter_counts_against_the_baseline():
    d, L, K, d_v, hd = WIDTH, DEPTH, 4, 4, WIDTH // 2
    base = count_parameters(model("transformer"))
    hidden = 8 * d // 3
    per_block = 3 * d * d + d * d + 3 * d * hidden + 2 * d  # qkv, out, SwiGLU, norms
    assert base == VOCAB * d + L * per_block + d  # tied head, final norm
    generators = lambda d_v: 2 * L * ((d + 1) + (d + 1) * d_v)  # noqa: E731  β and v maps
    expanded = d * d_v * K + (L + 1) * d * d_v  # EC kernel, CC compressors and read-out
    counts = {
        ("ddl-transformer", 1): base + generators(1),
        ("ddl-write-transformer", 1): base + generators(1),
        ("ddl-transformer", d_v): base + expanded + generators(d_v),
        ("ddl-write-transformer", d_v): base + expanded + generators(d_v),
        ("transformer", d_v): base + expanded + 2 * L * d_v,  # write vectors
    }
    for (name, channels), want in counts.items():
        assert count_parameters(model(name, value_channels=channels)) == want, (name, channels)
    tc = count_parameters(model("ddl-transformer", value_channels=d_v, compressor="token"))
    assert tc == base + d * d_v * K + (L + 1) * (d * d_v * K + d_v) + generators(d_v)
    # v-Map: a d × d direction map per sublayer, its value map reads h (same size)
    for channels in (1, d_v):
        k_map = count_parameters(model("ddl-transformer", value_channels=channels))
        v_map = count_parameters(
            model("ddl-transformer", value_channels=channels, generator="v-map")
        )
        assert v_map == k_map + 2 * L * d * d
    assert count_parameters(model("transformer", expansion="conv")) == base + d * K  # EC
    assert count_parameters(model("transformer", qk_norm=True)) == base + L * 2 * hd


def test_match_hidden_sizes_the_mlp_to_the_baseline():
    target = count_parameters(model("transformer", width=32))
    options = {**BASE, "width": 32, "value_channels": 4}
    hidden = match_hidden("ddl-transformer", target, **options)
    got = count_parameters(make_model("ddl-transformer", hidden=hidden, **options))
    assert hidden < 8 * 32 // 3 and abs(got - target) <= 0.1 * target


@pytest.mark.parametrize("name", ["ddl-transformer", "ddl-write-transformer"])
@pytest.mark.parametrize("channels", [1, 4])
def test_probe_records_every_sublayer(name, channels):
    m = scrambled(model(name, value_channels=channels))
    x = tokens()
    probe = m.probe(x)
    S = 2 * DEPTH
    assert probe.beta.shape == (3, T, S) and probe.k.shape == (3, T, S, WIDTH)
    assert probe.v.shape == probe.e_pre.shape == (3, T, S, channels)
    assert ((probe.beta > 0) & (probe.beta < 2)).all()
    torch.testing.assert_close(probe.k.norm(dim=-1), torch.ones(3, T, S), atol=1e-5, rtol=0)
    ratio = probe.e_post.norm(dim=-1) / probe.e_pre.norm(dim=-1)
    if name == "ddl-transformer":  # e_post = (1 − β) e_pre, the operator's identity
        torch.testing.assert_close(ratio, (1 - probe.beta).abs(), atol=1e-4, rtol=1e-4)
    else:  # writing without erasing: e_post = e_pre + β v (kᵀk = 1)
        torch.testing.assert_close(
            probe.e_post, probe.e_pre + probe.beta[..., None] * probe.v, atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"value_channels": 0}, "value_channels must be an integer >= 1"),
        ({"compressor": "tokens"}, "unknown compressor 'tokens'"),
        ({"expansion": "tile"}, "unknown expansion 'tile'"),
        ({"heads": 3}, "not divisible by heads=3"),
        ({"head_dim": 5}, "head_dim must be even"),
        ({"beta_init": 2.0}, "initial gate 2.0 must lie strictly inside"),
        ({"value": "tanh"}, "unknown value 'tanh'"),
        ({"value_scale": 0.0}, "value_scale must be positive"),
        ({"control_dim": 1}, "takes no per-step controls"),
        ({"generator": "q-map"}, "unknown generator 'q-map'"),
        ({"generator": "v-map", "value": "constant"}, "v-map reads v from the sublayer"),
        ({"generator": "v-map", "value_input": "context"}, "v-map reads v from the sublayer"),
        ({"compressor_init": "zero"}, "unknown compressor_init 'zero'"),
        ({"norm_eps": 0.0}, "norm_eps must be positive"),
    ],
)
def test_bad_options_fail_with_one_clear_message(options, message):
    with pytest.raises(ValueError, match=message):
        model("ddl-transformer", **options)


def test_bad_inputs_fail_with_one_clear_message():
    m = model("transformer")
    with pytest.raises(ValueError, match="integer ids of shape"):
        m(torch.randn(2, T))
    with pytest.raises(ValueError, match="no per-step controls"):
        m(tokens(), u=torch.zeros(3, T, 1))
    with pytest.raises(ValueError, match="differs from the sequence length"):
        m(tokens(), steps=T + 1)


def test_head_is_tied_to_the_embedding_unless_classes_differ_from_the_vocabulary():
    tied, untied = model("transformer"), model("transformer", out_dim=3)
    assert tied.head.weight is tied.embed.weight
    assert untied(tokens()).shape == (3, T, 3) and untied.head.weight is not untied.embed.weight


def test_bf16_autocast_keeps_gates_in_float32():
    m = model("ddl-transformer", value_channels=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(tokens())
        beta = m.probe(tokens()).beta
    assert torch.isfinite(out.float()).all() and beta.dtype == torch.float32
    assert F.mse_loss(out.float(), m(tokens())) < 1e-2


def test_flops_count_attention_on_cpu():
    """Linear layers cost ∝ T, attention's QKᵀ and AV ∝ T²: the T² term must be counted."""

    def flops(length: int) -> int:
        with flop_counter() as counter:
            model("transformer")(tokens(batch=1, length=length))
        return counter.get_total_flops()

    assert flops(2 * T) - 2 * flops(T) == 2 * DEPTH * 4 * WIDTH * T**2


def study(name: str) -> ExperimentConfig:
    """An experiment file of the Transformer study, loaded and checked as any experiment."""
    return load_experiment(Path(__file__).resolve().parents[1] / "experiments" / f"{name}.toml")


@pytest.mark.slow  # over 8 s on 2 cores
def test_transformer_study_is_tuned_matched_and_declares_its_controls():
    config = study("transformer")
    assert len(config.seeds) >= 8 and config.tune_defaults == {"lr": (1e-3, 3e-3, 1e-2)}
    labels = {m.label for m in config.models}
    assert config.comparisons and all({c.model, c.control} <= labels for c in config.comparisons)
    counts: dict[str, dict[str, int]] = {}
    for cell in expand_cells(config, seeds=[0]):
        task = make_task(cell.task, **cell.spec)
        with torch.device("meta"):
            built = make_model(cell.model, in_dim=task.in_dim, out_dim=task.out_dim, **cell.config)
        counts.setdefault(cell.task_label, {})[cell.label] = count_parameters(built)
        assert cell.config["qk_norm"] and cell.config["norm_eps"] == 1e-5  # the released block
    assert set(counts) == {
        *(f"var-chain[hops={h},reassign={r}]" for h in (1, 2) for r in ("false", "true")),
        "mqar-w16",
        "mqar-w32[pairs=2]",
        "mqar-w32[pairs=4]",
    }
    for task, rows in counts.items():
        assert len(rows) == (8 if task.startswith("var-chain") else 6), task
        for label, n in rows.items():
            assert abs(n / rows["transformer"] - 1) < 0.1, (task, label, n)
    for c in config.comparisons:  # every declared contrast runs somewhere, on the same budget
        both = [t for t, rows in counts.items() if {c.model, c.control} <= set(rows)]
        assert both, c


def test_the_quick_transformer_study_is_the_study_at_fewer_steps():
    full, quick = study("transformer"), study("transformer-quick")
    assert (full.tune_defaults, full.comparisons) == (quick.tune_defaults, quick.comparisons)
    pairs = list(zip(expand_cells(full), expand_cells(quick), strict=True))
    assert len(pairs) == len(full.seeds) * len(full.tune_defaults["lr"]) * (4 * 8 + 3 * 6)
    for a, b in pairs:
        assert dataclasses.replace(a, train=b.train) == b
        assert (
            dataclasses.replace(a.train, steps=b.train.steps, eval_every=b.train.eval_every)
            == b.train
        )
        assert a.train.steps == 4 * b.train.steps


def test_rotary_turns_each_pair_by_its_tokens_angle():
    """RoPE by hand: the pair (x_i, x_{i + hd/2}) of token t turned by t · base^(−2i/hd); the
    tables are built once per length and kept."""
    x = torch.randn(2, 3, T, 8)
    angle = torch.arange(T)[:, None] * 100.0 ** (-torch.arange(0, 8, 2) / 8)
    x1, x2 = x.chunk(2, dim=-1)
    want = torch.cat(
        [x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1
    )
    torch.testing.assert_close(rotary(x, 100.0), want)
    assert rope_tables(T, 8, 100.0, x.device, x.dtype) is rope_tables(
        T, 8, 100.0, x.device, x.dtype
    )
    m = model("transformer", qk_norm=True)
    with torch.inference_mode():  # a length first seen in inference mode still trains
        m(tokens(length=T + 5))
    m(tokens(length=T + 5)).sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "name, options", [("transformer", {}), ("ddl-transformer", {"value_channels": 4})]
)
def test_cuda_folded_step_in_bf16_autocast_follows_the_cpu_in_float32(name, options):
    """The studies' folded step on CUDA under bfloat16 autocast: the same function as on the
    CPU in float32, to bf16's rounding, with finite gradients everywhere."""
    from ddl_dynamics.models.ensemble import fold

    members = [model(name, seed=s, qk_norm=True, norm_eps=1e-5, **options) for s in range(3)]
    x = tokens(batch=6)
    want = fold(members).module(x)
    folded = fold(members).module.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = folded(x.cuda())
    got.float().square().mean().backward()
    assert (got.float().cpu() - want).abs().mean() < 0.05 * want.abs().mean()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in folded.parameters())


def cells_of(name: str) -> dict[str, dict[str, torch.nn.Module]]:
    """Every (task setting, row) of a study's first seed, built on the meta device."""
    built: dict[str, dict[str, torch.nn.Module]] = {}
    for cell in expand_cells(study(name), seeds=[0]):
        task = make_task(cell.task, **cell.spec)
        with torch.device("meta"):
            built.setdefault(cell.task_label, {})[cell.label] = make_model(
                cell.model, in_dim=task.in_dim, out_dim=task.out_dim, **cell.config
            )
    return built


def assert_matched_and_compared(
    name: str, rows: set[str], unmatched: frozenset[str] = frozenset()
) -> None:
    """Every row but the ``unmatched`` ones (sized on purpose) within 1% of the baseline's
    parameters, and every comparison among the rows."""
    config = study(name)
    assert len(config.seeds) == 8 and config.baseline == "transformer"
    built = cells_of(name)
    for task, models in built.items():
        assert set(models) == rows, task
        base = count_parameters(models["transformer"])
        for label, m in models.items():
            matched = abs(count_parameters(m) / base - 1) < 0.01
            assert matched != (label in unmatched), (task, label)
    assert all({c.model, c.control} <= rows for c in config.comparisons)


@pytest.mark.slow  # over 10 s on 2 cores
def test_the_depth_study_sweeps_hops_at_four_blocks_and_width_at_the_hardest():
    rows = {"transformer", "ddl-dv1", "ddl-write-dv1", "ddl-dv4", "additive-dv4"}
    assert_matched_and_compared("transformer-depth", rows)
    config = study("transformer-depth")
    assert {(c.model, c.control) for c in config.comparisons} == {
        ("ddl-dv1", "ddl-write-dv1"),
        ("ddl-dv4", "additive-dv4"),
    }
    settings = {
        (
            c.task_label,
            c.config["width"],
            c.config["depth"],
            c.spec["hops"],
            c.spec.get("reassign", False),
        )
        for c in expand_cells(config, seeds=[0])
    }
    assert {s[2] for s in settings} == {4}
    assert {s[3] for s in settings if s[1] == 32 and not s[4]} == {1, 2, 3, 4}
    for width in (16, 32, 64):  # plain recall and the hardest hops, with and without reassign
        assert {(s[3], s[4]) for s in settings if s[1] == width} >= {
            (1, False),
            (4, False),
            (4, True),
        }


def test_the_language_model_study_tunes_its_rows_and_the_controls_of_the_dv4_gain():
    rows = {
        "transformer",
        "ddl-dv1",
        "ddl-dv4",
        "ddl-write-dv4",
        "transformer-ec",
        "additive-dv4",
        "transformer-w40",
    }
    assert_matched_and_compared("charlm", rows, frozenset({"transformer-w40"}))
    config = study("charlm")
    cells = expand_cells(config, seeds=[0])
    assert {c.task for c in cells} == {"char-lm"} and len(config.tune_defaults["lr"]) >= 3
    assert {(c.model, c.control) for c in config.comparisons} == {
        ("ddl-dv1", "transformer"),
        ("ddl-dv4", "transformer"),
        ("ddl-write-dv4", "transformer"),
        ("ddl-dv4", "ddl-write-dv4"),
        ("ddl-dv4", "additive-dv4"),
        ("additive-dv4", "transformer-ec"),
        ("transformer-ec", "transformer"),
        ("ddl-dv4", "transformer-w40"),
        ("ddl-write-dv4", "transformer-w40"),
    }
    by_label = {c.label: c for c in cells}
    dv4 = by_label["ddl-dv4"]
    assert dv4.config["value_channels"] == 4 and dv4.config.get("expansion") in (None, "conv")
    assert by_label["transformer-ec"].config["expansion"] == "conv"
    assert by_label["additive-dv4"].config["value_channels"] == 4
    assert by_label["transformer-w40"].config["width"] == 40


@pytest.mark.slow  # over 10 s on 2 cores
def test_the_gpu_study_runs_eight_blocks_at_width_256_in_bf16_on_cuda():
    cells = expand_cells(study("transformer-gpu"), seeds=[0])
    assert {(c.config["width"], c.config["depth"]) for c in cells} == {(256, 8)}
    assert all(c.train.device == "cuda" and c.train.bf16 for c in cells)
    assert max(c.spec["hops"] for c in cells) == 8


@pytest.mark.parametrize("T", [1, 4, 10])
def test_broadcast_attention_is_causal_attention_with_its_gradients(T):
    """The short sequences' form under compile (:func:`broadcast_attention`) against torch's
    fused kernel, in float64: outputs and the gradients of q, k and v."""
    g = torch.Generator().manual_seed(T)
    q, k, v = (
        torch.randn(3, 2, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    weight = torch.randn(3, 2, T, 8, generator=g, dtype=torch.float64)
    ours = broadcast_attention(q, k, v)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, fused, rtol=1e-12, atol=1e-12)
    grads = [torch.autograd.grad((out * weight).sum(), (q, k, v)) for out in (ours, fused)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("value_channels", [2, 4])
def test_the_forms_compiled_steps_take_compute_what_the_eager_ones_do(monkeypatch, value_channels):
    """Under torch.compile a several-output causal conv takes shifted products that inductor
    fuses; run eagerly (``is_compiling`` forced), in float64, they equal the eager einsum,
    values and gradients, alone and folded."""
    g = torch.Generator().manual_seed(value_channels)
    x = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(
        2, 4, value_channels, 8, generator=g, dtype=torch.float64, requires_grad=True
    )

    def outputs():
        outs = (causal_conv(x, taps), causal_conv(x[0], taps[0]))
        grads = torch.autograd.grad(sum(o.square().sum() for o in outs), (x, taps))
        return outs, grads

    eager = outputs()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for ours, theirs in zip(outputs(), eager, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
