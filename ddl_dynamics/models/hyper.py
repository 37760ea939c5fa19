"""Hyper-Connections and mHC: several residual streams mixed by learned matrices.

Hyper-Connections (Zhu et al. 2024) widen the residual into ``streams`` copies: each layer
reads a learned mix of the streams into its branch, mixes the streams among themselves, and
adds the branch output back to each with a learned weight (static weights plus small
state-dependent terms). mHC (2025) constrains the stream mixing to doubly-stochastic
matrices (Sinkhorn) and the read/write weights to positive ones. Both come from the
``hyper-connections`` package, not re-implemented here; around them sits the branch of
``resnet``, ``f_l([x; u_l])``.

The streams start as copies of the encoded input, and the state the decoder reads is their
mean (the package's sum over streams, over ``streams``): with the package's initialisation
every stream of ``hc`` then equals the ``resnet`` state with the same branch weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, ClassVar, cast

import hyper_connections
import torch
from torch import Tensor, nn

from .._checks import check_int
from .base import DepthModel, join, register_model
from .ensemble import EnsembleVmap, register_twin


class _HyperLayer(nn.Module):
    """One layer: the package's connection module around a ``resnet`` branch."""

    def __init__(self, connection: nn.Module, branch: nn.Module) -> None:
        super().__init__()
        self.connection = connection
        self.branch = branch

    def forward(self, streams: Tensor, u_i: Tensor | None) -> Tensor:
        branch_input, add_residual = self.connection(streams)
        return add_residual(self.branch(join(branch_input, u_i)))


class _HyperStack(DepthModel):
    """Shared body of ``hc`` and ``mhc``, which differ only in the package's functions.

    Options:
        streams: residual streams ``n ≥ 1``; the state is ``n`` copies of width
            ``state_dim``, held as ``(B·n, state_dim)`` (the package's layout). With one
            stream the package falls back to a plain residual, ``resnet``.

    The stacks fold into ensembles (seeds × grid values) although the package keeps its
    mixing weights as bare parameters, which no layer twin of `ensemble` covers: a
    layer's twin is `EnsembleVmap`, the package's own code under
    ``torch.func.vmap`` over the members' stacked weights.
    """

    #: The package's ``get_init_and_expand_reduce_stream_functions`` of this variant.
    functions: ClassVar[Any]
    mixes_streams = True

    def __init__(self, *, streams: int = 4, **common: Any) -> None:
        super().__init__(**common)
        self.streams = check_int("streams", streams, 1)
        init, self.expand, self.reduce = type(self).functions(self.streams)
        context = self.state_dim + self.control_dim
        built = iter(range(self.depth))
        self.layers = self.per_layer(
            lambda: _HyperLayer(
                init(dim=self.state_dim, layer_index=next(built)),
                self.branch(context, self.state_dim),
            )
        )

    def states(
        self, x: Tensor, u: Tensor | None = None, steps: int | None = None
    ) -> Iterator[Tensor]:
        """The streams' mean before and after every step, ``(B, state_dim)`` each."""
        steps = self.resolve_steps(x, u, steps)
        streams = self.expand(self.encode(x))  # (B·n, state_dim)
        yield self.readout(streams)
        for i in range(steps):
            streams = self.layer(i)(streams, None if u is None else u[:, i])
            yield self.readout(streams)

    def readout(self, streams: Tensor) -> Tensor:
        """The state the decoder reads: the streams' mean, ``(B·n, d) → (B, d)``."""
        return self.reduce(streams) / self.streams

    @torch.no_grad()
    def stream_mixing(self) -> Tensor:
        """Each layer's static stream mixing H_res, ``(depth, streams, streams)``, from the
        weights alone, so that an audit of trained weights can say whether training moved it:
        the matrix the package makes of ``static_alpha[:, 1:]`` (`mixing`). Left out is the
        state-dependent term the package adds at every step: its scale
        (``dynamic_alpha_scale``, ``residual_scale``) multiplies a projection of the states
        whose weights start at zero, so the scale alone does not size it. One stream is the
        package's plain residual, ``[[1]]``."""
        if self.streams == 1:
            return torch.ones(self.depth, 1, 1)
        layers = [cast(_HyperLayer, self.layer(i)) for i in range(self.depth)]
        return torch.stack([self.mixing(layer.connection) for layer in layers])

    @staticmethod
    def mixing(connection: nn.Module) -> Tensor:
        """``hc``'s static mixing: the weights as they are, the identity at initialisation."""
        return cast(Tensor, connection.static_alpha)[:, 1:]


register_twin(_HyperLayer, EnsembleVmap)


@register_model("hc")
class HyperConnectionsModel(_HyperStack):
    """Hyper-Connections: several residual streams mixed by learned matrices (Zhu et al. 2024)."""

    compile_gain = 2.2

    functions = staticmethod(hyper_connections.get_init_and_expand_reduce_stream_functions)


@register_model("mhc")
class ManifoldHyperConnectionsModel(_HyperStack):
    """mHC: Hyper-Connections whose stream mixing is doubly stochastic (Sinkhorn).

    The package's Sinkhorn runs in the log domain (its ``log_domain_sinkhorn``): the same
    20 iterations toward the same doubly-stochastic matrix, stable for large logits, and on
    the CPU half the step time of the exponential form, whose per-sample L1 normalisations
    over a 4 × 4 matrix dominate a step.
    """

    compile_gain = 1.3

    functions = staticmethod(
        partial(
            hyper_connections.mc_get_init_and_expand_reduce_stream_functions,
            log_domain_sinkhorn=True,
        )
    )

    @staticmethod
    def mixing(connection: nn.Module) -> Tensor:
        """mHC's static mixing: the package's own constraint of the weights (its
        ``residual_mix_constraint_fn``, Sinkhorn). Sinkhorn reads the weights as logits, so
        the identity they start at gives not the identity but e/(e+n−1) on the diagonal and
        1/(e+n−1) elsewhere: 0.475 and 0.175 for 4 streams, ‖H − I‖_F = 1.21."""
        constrain = cast(Any, connection).residual_mix_constraint_fn
        return cast(Tensor, constrain(cast(Tensor, connection.static_alpha)[:, 1:]))
