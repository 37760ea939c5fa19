"""Transformers over token sequences: the additive baseline, the Deep Delta Learning block and
its matched controls, in one nanoGPT-style file.

Every variant is the same backbone — token embedding, pre-norm RMSNorm, multi-head causal
attention with RoPE, SwiGLU MLP, final RMSNorm, LM head tied to the embedding — and differs
only in how each sublayer's output ``h`` is written into the residual state of its token:

    transformer              X ← X + h wᵀ                  additive (w = 1 when d_v = 1)
    ddl-transformer          X ← X + β k (vᵀ − kᵀX)         k = h / sqrt(‖h‖² + ε²)
    ddl-write-transformer    X ← X + β k vᵀ                  the same, without the erase term

With ``product`` n_h > 1 a Delta sublayer takes n_h such updates in turn, each with its own
``k_h, v_h, β_h`` from the same sublayer pass (a Householder product: at β = 2 two reflections
make a rotation, or a 3-cycle of items).

The state of a token is ``X ∈ R^{d×d_v}``, held channels first, ``(B, T, d_v, d)``: each value
channel a contiguous d-vector, so that the passes over the state (expansion, compression,
residual updates) run along d rather than along the few channels of a coordinate (inductor's
loops on the CPU vectorise along the last axis); the Delta update reads it as ``X.mT``,
``(B, T, d, d_v)``. With ``value_channels`` d_v > 1 the layers follow Compress–Process–Rewrite:
the embedding is expanded into d_v channels (``expansion``), every block compresses X to the
width-d input of its two sublayers (``compressor``), and a last compressor reads X out before
the final norm. ``transformer`` with d_v > 1 is therefore the additive expanded-state
control: the expansion and compression of DDL, with a residual add.

Per sublayer: ``x_in = compress(X)``, ``c = RMSNorm(x_in)``, ``h = sublayer(c)``. The Delta
generators follow the authors' released code (the *k-Map* layout): ``k̃ = h``;
``β = β_max σ(Linear(c))`` in at least float32 (``beta_max`` = 2 by default: reflections
allowed; 1: none), bias initialised so that ``β = beta_init`` for
``c = 0``; ``v = 4σ(Linear(x_in))`` read from the (compressed) residual stream. The *v-Map*
layout swaps the roles: ``v = 4σ(Linear(h))`` from the sublayer output and ``k̃ = Linear(c)``
from a light branch on the context. The update is
`delta_update` (or ``write_update``), whose readout
``kᵀX`` accumulates in float32.

Three options reproduce the released block where this file's defaults differ: ``qk_norm``
(RMSNorm with a learned gain on every head's queries and keys, after RoPE), ``norm_eps =
1e-5`` (every RMSNorm's eps; by default torch's, the dtype's machine epsilon) and
``compressor_init = "random"`` (the compressors' matrices drawn N(0, 0.25/d) instead of
starting as the channel mean).

The attention is `ddl_dynamics.models.attention`'s, the expansion and compressors of the
state `ddl_dynamics.models.expanded_state`'s, the Delta generators and update
`ddl_dynamics.models.transformer_delta`'s. Every parameter sits in a layer that `ensemble`
can fold (``nn.Linear``, ``nn.Embedding``, ``nn.RMSNorm`` and the leaves of
`ddl_dynamics.models.transformer_leaves`, which registers their twins), so a row's seeds
train as one ensemble.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_choice, check_int
from .attention import Attention, head_size
from .base import Model, register_model
from .delta import DeltaProbe
from .expanded_state import (
    COMPRESSOR_INITS,
    COMPRESSORS,
    EXPANSIONS,
    compressor_layer,
    expansion_layer,
)
from .operator import delta_update, normalize_direction, write_update
from .transformer_delta import DeltaResidual, Generators
from .transformer_leaves import Relaid, Scale


class _SwiGLU(nn.Module):
    """``W_out (silu(W_gate c) ⊙ W_up c)``: ``(B, T, d) → (B, T, outputs)`` (default d)
    through ``hidden``."""

    def __init__(self, width: int, hidden: int, outputs: int | None = None) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.out = nn.Linear(hidden, width if outputs is None else outputs, bias=False)

    def forward(self, c: Tensor) -> Tensor:
        return self.out(F.silu(self.gate(c)) * self.up(c))


# --- residual updates: how a sublayer's output h enters the state


class _AddResidual(Relaid):
    """``X + h wᵀ``: the additive residual. With d_v > 1, ``w`` is a learned write vector over
    the value channels (initialised to 1, so the channels can diverge), held ``(d_v, 1)`` as
    the state is, channels first (version 1: ``(d_v,)``); with d_v = 1, ``x + h``."""

    relaid_key = "write.weight"

    def __init__(self, value_channels: int) -> None:
        super().__init__()
        self.write = Scale(torch.ones(value_channels, 1)) if value_channels > 1 else None

    def forward(self, X: Tensor, x_in: Tensor, c: Tensor, h: Tensor) -> Tensor:
        h = h.unsqueeze(-2)  # (B, T, 1, d)
        return X + (h if self.write is None else self.write(h))

    def relay(self, saved: Tensor) -> Tensor:
        return saved.unsqueeze(-1)


class Sublayer(NamedTuple):
    """One sublayer's pass over the state: the sublayer and its residual update, the state
    before (``(B, T, d_v, d)``, channels first), the sublayer's input ``x_in``, context ``c`` and
    output ``h``, the state after."""

    sublayer: nn.Module
    residual: nn.Module
    before: Tensor
    x_in: Tensor
    c: Tensor
    h: Tensor
    after: Tensor


class _Block(nn.Module):
    """Attention, then MLP; each: compress → RMSNorm → sublayer → residual update."""

    def __init__(
        self,
        compress: nn.Module,
        sublayers: tuple[nn.Module, nn.Module],
        residuals: tuple[nn.Module, nn.Module],
        width: int,
        eps: float | None,
    ) -> None:
        super().__init__()
        self.compress = compress  # one compressor serves both sublayers of the block
        self.norms = nn.ModuleList([nn.RMSNorm(width, eps=eps), nn.RMSNorm(width, eps=eps)])
        self.sublayers = nn.ModuleList(sublayers)
        self.residuals = nn.ModuleList(residuals)

    def process(self, i: int, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sublayer ``i`` on the state ``X``: its input ``x_in``, context ``c`` and output ``h``,
        each ``(B, T, d)``."""
        x_in = self.compress(X)
        c = self.norms[i](x_in)
        return x_in, c, self.sublayers[i](c)

    def forward(self, X: Tensor) -> Tensor:  # (B, T, d_v, d) → (B, T, d_v, d)
        for i, residual in enumerate(self.residuals):
            X = residual(X, *self.process(i, X))
        return X


def _checked_options(
    family: str,
    control_dim: int,
    expansion: str | None,
    compressor: str,
    compressor_init: str,
    d_v: int,
) -> str:
    """The expansion (default: EC where the state is expanded), once it, the compressor
    and the absence of per-step controls are checked."""
    if control_dim:
        raise ValueError(
            f"{family} takes no per-step controls (control_dim must be 0, got {control_dim!r})"
        )
    if expansion is None:
        expansion = "conv" if d_v > 1 else "repeat"
    check_choice("expansion", expansion, EXPANSIONS)
    check_choice("compressor", compressor, COMPRESSORS)
    check_choice("compressor_init", compressor_init, COMPRESSOR_INITS)
    return expansion


def _check_positions_and_norms(rope_base: float, norm_eps: float | None) -> None:
    """RoPE's base above 1, and the norms' ε positive where set."""
    if not rope_base > 1:
        raise ValueError(f"rope_base must be > 1, got {rope_base!r}")
    if norm_eps is not None and not (math.isfinite(norm_eps) and norm_eps > 0):
        raise ValueError(f"norm_eps must be positive, got {norm_eps!r}")


@register_model("transformer")
class Transformer(Model):
    """Pre-norm Transformer (RoPE attention, SwiGLU), additive residual x + F(x); with
    value_channels > 1, the additive expanded-state control.

    Built as ``make_model(name, in_dim=vocabulary, out_dim=classes, **options)`` and called as
    ``model(tokens (B, T), per_step=True)`` → logits ``(B, T, out_dim)`` (``per_step=False``:
    the last token's, ``(B, out_dim)``). RoPE lets it run sequences of any length. The LM head
    is tied to the embedding when ``out_dim == in_dim``.

    Args:
        width: model width d. depth: number of blocks (each attention + MLP).
        heads: attention heads. head_dim: size of a head (default ``width // heads``).
        hidden: SwiGLU hidden size (default ``⌊8·width/3⌋``); parameter matching sizes it.
        value_channels: d_v, value channels of the residual state.
        expansion: ``"conv"`` (EC, an identity-initialised causal convolution of the
            embedding over tokens) or ``"repeat"`` (none); default ``"conv"`` for d_v > 1 and
            ``"repeat"`` for d_v = 1, where ``"conv"`` is EC without the expanded state.
        compressor: d_v > 1: ``"channel"`` (CC) or ``"token"`` (TC).
        compressor_init: d_v > 1: ``"mean"`` or ``"random"`` (the released code's).
        kernel_size: token-axis kernel of the EC expansion and the TC compressor.
        rope_base: RoPE frequency base.
        qk_norm: RMSNorm on each head's queries and keys (the released attention).
        norm_eps: eps of every RMSNorm (None: torch's default; the released code's: 1e-5).
    """

    kind = "sequence"
    compile_gain = 1.9

    def __init__(
        self,
        *,
        in_dim: int,
        out_dim: int,
        control_dim: int = 0,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        head_dim: int | None = None,
        hidden: int | None = None,
        value_channels: int = 1,
        expansion: str | None = None,
        compressor: str = "channel",
        compressor_init: str = "mean",
        kernel_size: int = 4,
        rope_base: float = 10000.0,
        qk_norm: bool = False,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.in_dim = check_int("in_dim (vocabulary size)", in_dim, 1)
        self.out_dim = check_int("out_dim", out_dim, 1)
        self.width = check_int("width", width, 1)
        self.depth = check_int("depth", depth, 1)
        heads = check_int("heads", heads, 1)
        head_dim = head_size(width, heads, head_dim)
        self.hidden = check_int("hidden", 8 * width // 3 if hidden is None else hidden, 1)
        self.value_channels = d_v = check_int("value_channels", value_channels, 1)
        expansion = _checked_options(
            type(self).__name__, control_dim, expansion, compressor, compressor_init, d_v
        )
        kernel_size = check_int("kernel_size", kernel_size, 1)
        _check_positions_and_norms(rope_base, norm_eps)
        compress = functools.partial(
            compressor_layer, compressor, width, d_v, kernel_size, compressor_init
        )  # one per block, and the readout's
        outputs = self.sublayer_outputs()
        self.embed = nn.Embedding(in_dim, width)
        self.expand = expansion_layer(expansion, width, d_v, kernel_size)
        self.blocks = nn.ModuleList(
            _Block(
                compress(),
                (
                    Attention(width, heads, head_dim, rope_base, qk_norm, norm_eps, outputs),
                    _SwiGLU(width, self.hidden, outputs),
                ),
                (self.residual(), self.residual()),
                width,
                norm_eps,
            )
            for _ in range(depth)
        )
        self.readout = compress()
        self.norm = nn.RMSNorm(width, eps=norm_eps)
        self.head = nn.Linear(width, out_dim, bias=False)
        self._init_weights()
        if out_dim == in_dim:
            self.head.weight = self.embed.weight

    @property
    def can_extrapolate(self) -> bool:
        """True: with RoPE it runs sequences of any length."""
        return True

    def residual(self) -> nn.Module:
        """A fresh residual update for one sublayer; the Delta families override it."""
        return _AddResidual(self.value_channels)

    def sublayer_outputs(self) -> int:
        """The width of a sublayer's output ``h``: d, the width of the state it enters."""
        return self.width

    def _init_weights(self) -> None:
        """As the authors' code: embedding and head N(0, 0.02²); other matrices N(0, 0.25/d),
        the sublayers' output projections further scaled by 1/√depth."""
        std = 0.5 / math.sqrt(self.width)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std)
            for block in cast("Iterable[_Block]", self.blocks):
                for sublayer in block.sublayers:
                    cast(nn.Linear, sublayer.out).weight.normal_(0.0, std / math.sqrt(self.depth))
            self.embed.weight.normal_(0.0, 0.02)
            self.head.weight.normal_(0.0, 0.02)

    def forward(
        self,
        tokens: Tensor,
        u: Tensor | None = None,
        steps: int | None = None,
        per_step: bool = True,
    ) -> Tensor:
        """Logits at every position ``(B, T, out_dim)``, or at the last one (``per_step=False``)."""
        X = self.state(tokens, u, steps)
        for block in cast("Iterable[_Block]", self.blocks):
            X = block(X)
        logits = self.head(self.norm(self.readout(X)))  # (B, T, out_dim)
        return logits if per_step else logits[:, -1]

    def passes(self, tokens: Tensor) -> Iterator[Sublayer]:
        """Every sublayer's pass over the state of ``tokens``, in order (attention, MLP,
        attention, …): what the probes read."""
        X = self.state(tokens)
        for block in cast("Iterable[_Block]", self.blocks):
            for i, residual in enumerate(block.residuals):
                x_in, c, h = block.process(i, X)
                after = residual(X, x_in, c, h)
                yield Sublayer(block.sublayers[i], residual, X, x_in, c, h, after)
                X = after

    @torch.no_grad()
    def looks(self, tokens: Tensor) -> Tensor:
        """Where every head of every block's attention looks from each token: the key
        position it weighs most, ``(B, T, depth, heads)``."""
        return torch.stack(
            [
                p.sublayer.weights(p.c).argmax(-1).transpose(1, 2)
                for p in self.passes(tokens)
                if isinstance(p.sublayer, Attention)
            ],
            dim=2,
        )

    def state(self, tokens: Tensor, u: Tensor | None = None, steps: int | None = None) -> Tensor:
        """The initial residual state ``(B, T, d_v, d)`` of ``tokens`` (checked), channels first."""
        name = type(self).__name__
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(
                f"{name}: tokens must be integer ids of shape (batch, length), got "
                f"{tuple(tokens.shape)} {tokens.dtype}"
            )
        if u is not None:
            raise ValueError(f"{name} takes no per-step controls u")
        if steps is not None and steps != tokens.shape[1]:
            raise ValueError(
                f"{name}: steps={steps} differs from the sequence length {tokens.shape[1]}"
            )
        return self.expand(self.embed(tokens))


class _DeltaTransformer(Transformer):
    """Shared body of ``ddl-transformer`` and ``ddl-write-transformer``: they differ only in
    `erases` (the update `delta_update`, or `write_update`). Options are those of
    `Transformer` and `Generators` (``product``: n_h updates per sublayer)."""

    probes = True
    #: One update per sublayer: the block as it was before the option.
    late_options: ClassVar[Mapping[str, Any]] = {"product": 1}

    def __init__(
        self,
        *,
        generator: str = "k-map",
        beta_init: float = 1.0,
        beta_hidden: int = 0,
        value: str = "sigmoid",
        value_scale: float = 4.0,
        value_input: str = "stream",
        beta_max: float = 2.0,
        product: int = 1,
        **common: object,
    ) -> None:
        # set before the base builds the blocks: residual() reads it
        self.spec = Generators(
            generator,
            float(beta_init),
            beta_hidden,
            value,
            float(value_scale),
            value_input,
            float(beta_max),
            product,
        )
        super().__init__(**common)  # type: ignore[arg-type]

    @property
    def product(self) -> int:
        """n_h, the delta updates per sublayer."""
        return self.spec.product

    def residual(self) -> nn.Module:
        update = delta_update if self.erases else write_update
        return DeltaResidual(update, self.width, self.value_channels, self.spec)

    def sublayer_outputs(self) -> int:
        """k-Map reads each update's ``k̃`` from the sublayer output: n_h·d wide."""
        return self.width * (self.product if self.spec.generator == "k-map" else 1)

    @torch.no_grad()
    def probe(self, tokens: Tensor) -> DeltaProbe:
        """What every Delta update did to every token, as a `DeltaProbe` whose
        arrays are ``(B, T, S, ·)`` for ``S = 2 · depth · n_h`` rows (attention, MLP, attention,
        …; with n_h > 1 each sublayer's updates in turn, ``update`` saying which, as
        ``ddl-product``'s probe does): gate β, ‖k̃‖, direction k, target v, and the readout
        ``kᵀX`` before the update with the discrepancies ``e = kᵀX − v`` before and after it."""
        layers = []
        for p in self.passes(tokens):
            residual = cast(DeltaResidual, p.residual)
            k_raw, v, beta = residual.generators(p.x_in, p.c, p.h)
            k = normalize_direction(k_raw)
            if self.product == 1:  # the sublayer's own output: one update
                layers.append((beta, k_raw, k.to(p.before.dtype), v, p.before.mT, p.after.mT))
                continue
            X = p.before.mT
            for k_raw_h, k_h, v_h, beta_h in residual.each_update(k_raw, k, v, beta):
                after = residual.update(X, k_h, v_h, beta_h)
                layers.append((beta_h, k_raw_h, k_h.to(X.dtype), v_h, X, after))
                X = after
        probe = DeltaProbe.of_layers(layers, dim=2)
        if self.product == 1:
            return probe
        return dataclasses.replace(probe, update=torch.arange(self.product).repeat(2 * self.depth))


@register_model("ddl-transformer")
class DeltaTransformer(_DeltaTransformer):
    """Deep Delta Learning Transformer: each residual add replaced by X + βk(vᵀ − kᵀX)."""

    erases = True


@register_model("ddl-write-transformer")
class DeltaWriteTransformer(_DeltaTransformer):
    """Write-only control of ddl-transformer: the same generators and state, X + βkvᵀ."""

    erases = False
