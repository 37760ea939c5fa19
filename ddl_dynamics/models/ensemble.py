"""Several models of one architecture run as one module over a folded batch.

The members' parameters are stacked along a leading member axis, and their batches are
concatenated along the batch axis, member by member. Every layer that holds parameters is
replaced by its ensemble twin (`TWINS`: torch's layers here, each family's own added
by its module with `register_twin`), which applies member ``s``'s weights to member
``s``'s rows (a batched matmul, a lookup in its slice of a stacked table, a gain on its
rows); a parameter that several layers share, as a head tied to the embedding, stays one
stack. Every other op of a depth model or Transformer acts on each sample (each sequence)
alone, so it serves all members at once as it is. An ensemble of a few small models thus
costs little more than one where per-op overhead, not arithmetic, dominates.

This needs no ``torch.func`` transform: ``vmap`` over ``functional_call`` measured
1.3–3.3× as slow per training step (README, Performance), and the Delta operator's
autograd Function runs unchanged on the folded batch. A model folds once its parameters
sit in layers with a twin; a family registers its layers' twins where it defines the layers,
so a model that exists has its twins registered whatever was imported first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Branch, Model, members_first
from .function import PositionalFunction

Layer = TypeVar("Layer", bound=nn.Module)


def ensemble_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Member ``s``'s ``x W_sᵀ + b_s`` on its rows of ``x``, for ``weight`` ``(S, out, in)``."""
    rows = x.reshape(weight.shape[0], -1, x.shape[-1])  # (S, n·…, in)
    out = _MemberLinear.apply(rows, weight, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class _MemberLinear(PositionalFunction):
    """``rows_s W_sᵀ + b_s`` for ``rows (S, n, in)``, with the weight's gradient computed in the
    weight's own layout, ``g_sᵀ rows_s`` ``(S, out, in)`` row-major: autograd's, through
    ``weight.mT``, comes back transposed, and accumulating it into ``.grad`` would copy it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if bias is None:
            return rows @ weight.mT
        return torch.baddbmm(bias.unsqueeze(1), rows, weight.mT)

    @staticmethod
    def setup_context(
        ctx: Any, inputs: tuple[Tensor, Tensor, Tensor | None], output: Tensor
    ) -> None:
        ctx.save_for_backward(*inputs[:2])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rows, weight = ctx.saved_tensors
        return _MemberLinear.gradients(grad, rows, weight, ctx.needs_input_grad)

    @staticmethod
    def gradients(
        grad: Tensor, rows: Tensor, weight: Tensor, wants: Sequence[bool]
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The gradients of rows, weight and bias where ``wants`` them, from the output's."""
        return (
            grad @ weight if wants[0] else None,
            grad.mT @ rows if wants[1] else None,
            grad.sum(1) if wants[2] else None,
        )


class _MemberTanhBranch(PositionalFunction):
    """``tanh(rows_s W1_sᵀ + b1_s) W2_sᵀ + b2_s``, the folded tanh `Branch`, as one autograd
    node: the ops and gradients of its two `_MemberLinear` layers and ``tanh``, bit for bit,
    without the three nodes' per-call costs (small branches: a folded step of 4 seeds measured
    2–6% faster). The hidden activation is a second output, marked non-differentiable, so
    that ``setup_context`` can save it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        rows: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor
    ) -> tuple[Tensor, Tensor]:
        hidden = torch.tanh(_MemberLinear.forward(rows, w1, b1))
        return _MemberLinear.forward(hidden, w2, b2), hidden

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, Tensor]) -> None:
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:4], output[1])

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, _: None) -> tuple[Tensor | None, ...]:
        if grad is None:  # the output's gradient is zero (as in a double backward)
            return None, None, None, None, None
        rows, w1, b1, w2, hidden = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiated again: hidden as a function of the inputs
            hidden = torch.tanh(_MemberLinear.forward(rows, w1, b1))
        wants = ctx.needs_input_grad
        d_hidden, d_w2, d_b2 = _MemberLinear.gradients(grad, hidden, w2, (True, *wants[3:]))
        pre = torch.ops.aten.tanh_backward(d_hidden, hidden)  # what autograd's tanh does
        return *_MemberLinear.gradients(pre, rows, w1, wants[:3]), d_w2, d_b2


def stacked(layers: Sequence[nn.Module], name: str) -> nn.Parameter | None:
    """The members' parameter ``name`` stacked along a new leading member axis (None where
    the layers have none)."""
    params = [getattr(layer, name) for layer in layers]
    return None if params[0] is None else nn.Parameter(torch.stack([p.detach() for p in params]))


def stacked_weight(layers: Sequence[nn.Module]) -> nn.Parameter:
    """The members' ``weight`` stacked: a twinned layer holds one."""
    weight = stacked(layers, "weight")
    if weight is None:
        raise ValueError(f"a {type(layers[0]).__name__} without a weight has no twin")
    return weight


class EnsembleLinear(nn.Module):
    """``S`` linear layers over a folded batch: rows ``[s·n, (s+1)·n)`` go through layer ``s``.

    ``weight`` is ``(S, out, in)`` and ``bias`` ``(S, out)``: member ``s``'s slice has the
    layout of its own `Linear`.
    """

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.weight, self.bias = stacked_weight(layers), stacked(layers, "bias")

    def forward(self, x: Tensor) -> Tensor:
        return ensemble_linear(x, self.weight, self.bias)


class EnsembleBranch(nn.Module):
    """``S`` `Branch` MLPs over a folded batch: its two layers' twins (`EnsembleLinear`),
    under the member's names. A tanh branch, every study's, runs as one autograd node
    (`_MemberTanhBranch`); another activation, through the two layers."""

    def __init__(self, layers: Sequence[Branch]) -> None:
        super().__init__()
        self.inp = EnsembleLinear([layer.inp for layer in layers])
        self.act = layers[0].act
        self.out = EnsembleLinear([layer.out for layer in layers])

    def forward(self, z: Tensor) -> Tensor:
        if not isinstance(self.act, nn.Tanh):
            return self.out(self.act(self.inp(z)))
        inp, out = self.inp, self.out
        rows = z.reshape(inp.weight.shape[0], -1, z.shape[-1])
        y = _MemberTanhBranch.apply(rows, inp.weight, inp.bias, out.weight, out.bias)[0]
        return y.reshape(*z.shape[:-1], y.shape[-1])


class EnsembleEmbedding(nn.Module):
    """``S`` lookup tables: member ``s``'s ids index its own ``(vocab, d)`` slice of
    ``weight`` ``(S, vocab, d)``, which a tied head's `EnsembleLinear` shares."""

    def __init__(self, layers: Sequence[nn.Embedding]) -> None:
        super().__init__()
        if any(layer.padding_idx is not None or layer.max_norm is not None for layer in layers):
            raise ValueError("only plain embeddings fold (no padding_idx, no max_norm)")
        self.weight = stacked_weight(layers)

    def forward(self, ids: Tensor) -> Tensor:
        members, vocab = self.weight.shape[:2]
        offset = torch.arange(members, device=ids.device) * vocab
        rows, offset = members_first(offset, ids)
        return F.embedding((rows + offset).flatten(0, 1), self.weight.flatten(0, 1))


class EnsembleRMSNorm(nn.Module):
    """``S`` RMSNorms: one normalisation, then member ``s``'s gain on its rows."""

    def __init__(self, layers: Sequence[nn.RMSNorm]) -> None:
        super().__init__()
        self.normalized_shape, self.eps = layers[0].normalized_shape, layers[0].eps
        self.weight = stacked_weight(layers)

    def forward(self, x: Tensor) -> Tensor:
        rows, weight = members_first(
            self.weight, F.rms_norm(x, self.normalized_shape, eps=self.eps)
        )
        return (rows * weight).flatten(0, 1)


class EnsembleVmap(nn.Module):
    """``S`` copies of a module whose ops have no twins (a third-party layer), run under
    ``torch.func.vmap`` over the members' stacked parameters: member ``s``'s rows of every
    tensor argument go through its own weights. Arguments that are None pass through.

    The parameters are named by their path in the member with ``.`` as ``__``; ``sources``
    maps each back to that path, for `fold`'s slots.
    """

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.sources: dict[str, str] = {}
        for path, _ in layers[0].named_parameters():
            name = path.replace(".", "__")
            self.sources[name] = path
            self.register_parameter(
                name, nn.Parameter(torch.stack([m.get_parameter(path).detach() for m in layers]))
            )
        self.template = [copy.deepcopy(layers[0])]  # a list: not a submodule of the twin

    def forward(self, *args: Tensor | None) -> Tensor:
        members = next(iter(self.parameters())).shape[0]
        params = {path: getattr(self, name) for name, path in self.sources.items()}
        dims = tuple(None if a is None else 0 for a in args)
        rows = [None if a is None else a.unflatten(0, (members, -1)) for a in args]

        def member(weights: dict[str, Tensor], *inputs: Tensor | None) -> Tensor:
            return torch.func.functional_call(self.template[0], weights, inputs)

        out = torch.func.vmap(member, in_dims=(0, *dims), randomness="different")(params, *rows)
        return out.flatten(0, 1)


#: The layers that can hold parameters in a folded ensemble, with their twin's factory:
#: torch's, the `Branch` every depth family shares, and those each family adds with
#: `register_twin`.
TWINS: dict[type[nn.Module], Callable[..., nn.Module]] = {
    nn.Linear: EnsembleLinear,
    nn.Embedding: EnsembleEmbedding,
    nn.RMSNorm: EnsembleRMSNorm,
    Branch: EnsembleBranch,
}


def register_twin(layer: type[Layer], twin: Callable[[Sequence[Layer]], nn.Module]) -> None:
    """Fold every ``layer`` into ``twin(the members' layers)``. A family calls this for each
    layer type it defines that holds parameters, next to the layer, so the twin is known
    wherever such a layer exists; another twin for a type already twinned is an error."""
    if TWINS.get(layer, twin) is not twin:
        raise ValueError(f"{layer.__name__} already has an ensemble twin: {TWINS[layer]!r}")
    TWINS[layer] = twin


@dataclass
class Ensemble:
    """``members`` run as ``module`` on member-major folded batches.

    In an ensemble of several, every parameter of ``module`` has the member axis first;
    `export` writes member ``s``'s current weights back into ``members[s]``.
    An ensemble of one is the model itself.
    """

    module: nn.Module
    members: list[nn.Module]
    #: Each stacked parameter of ``module`` with the members' parameters it stacks.
    slots: list[tuple[nn.Parameter, list[nn.Parameter]]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.members)

    @torch.no_grad()
    def export(self, index: int) -> nn.Module:
        """``members[index]``, holding that member's weights as they are now."""
        for stacked, params in self.slots:
            params[index].copy_(stacked[index])
        return self.members[index]


def alone(model: nn.Module) -> Ensemble:
    """An ensemble of the one ``model``, which runs as itself."""
    return Ensemble(model, [model])


def fold(models: Sequence[nn.Module]) -> Ensemble | None:
    """The ensemble of ``models`` (same architecture, any weights) or None where it cannot
    be built: a layer holding parameters or buffers has no twin in `TWINS`, or a
    `Model`'s outputs for one member's rows depend on other members' (``members_independent``
    False, as for an adaptive ODE solve, whose step sizes the whole batch shares). A model
    whose ops mix only the rows of one member folds all the same: it says so with
    ``members_independent`` and is told the ensemble's size in its ``members``. A plain
    module declares nothing and is taken to act on each sample alone.

    A model folds correctly only where every op but its twinned layers acts per sample and
    keeps the batch on the first axis; callers compare a folded forward with the members'
    own before trusting it. Models of different architectures are refused (ValueError).
    """
    first = models[0]
    if len(models) == 1:
        return alone(first)
    _check_one_architecture(models)
    if isinstance(first, Model) and not first.members_independent:
        return None
    skeleton = copy.deepcopy(first)
    if isinstance(skeleton, Model):
        skeleton.members = len(models)
    paths = [dict(m.named_modules(remove_duplicate=False)) for m in models]
    twins: dict[int, nn.Module] = {}
    stacks: dict[tuple[int, ...], nn.Parameter] = {}  # the members' parameters → their stack
    slots: list[tuple[nn.Parameter, list[nn.Parameter]]] = []
    covered: list[str] = []  # twinned layers: a twin stands for its sublayers too
    for path, module in list(skeleton.named_modules(remove_duplicate=False)):
        twin_of = TWINS.get(type(module))
        if any(path.startswith(f"{done}.") for done in covered) or not (
            module._parameters or module._buffers or twin_of is not None
        ):
            continue
        if twin_of is None:
            return None
        covered.append(path)
        if id(module) not in twins:  # a layer shared by several paths gets one twin
            layers = [p[path] for p in paths]
            twins[id(module)] = twin = twin_of(layers)
            sources = getattr(twin, "sources", {})
            for name, param in list(twin.named_parameters()):
                own = [layer.get_parameter(sources.get(name, name)) for layer in layers]
                key = tuple(map(id, own))
                if key in stacks:  # a parameter shared by several layers (a tied head)
                    holder, _, leaf = name.rpartition(".")
                    setattr(twin.get_submodule(holder), leaf, stacks[key])
                else:
                    stacks[key] = param
                    slots.append((param, own))
        parent, _, name = path.rpartition(".")
        setattr(skeleton.get_submodule(parent), name, twins[id(module)])
    return Ensemble(skeleton, list(models), slots)


def _check_one_architecture(models: Sequence[nn.Module]) -> None:
    """Raise unless every model has the first's class and parameter names and shapes."""

    def layout(model: nn.Module) -> tuple[type, list[tuple[str, torch.Size]]]:
        return type(model), [(name, p.shape) for name, p in model.named_parameters()]

    first = layout(models[0])
    for i, model in enumerate(models[1:], 1):
        if layout(model) != first:
            raise ValueError(
                f"fold: models 0 and {i} differ in architecture (class, or parameter names "
                "and shapes); only seeds of one architecture train as one ensemble"
            )
