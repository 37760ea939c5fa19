"""Several models of one architecture run as one module over a folded batch.

The members' parameters are stacked along a leading member axis, and their batches are
concatenated along the batch axis, member by member. Every layer that holds parameters is
replaced by its ensemble twin (:data:`TWINS`), which applies member ``s``'s weights to
member ``s``'s rows in one batched matmul; every other op of a depth model acts on each
sample alone, so it serves all members at once as it is. An ensemble of a few small models
thus costs little more than one: what such models pay for is per-op overhead, not arithmetic.

This needs no change to the model files and no ``torch.func`` transform: ``vmap`` over
``functional_call`` measured 1.3–3.3× as slow per training step (README, Performance),
and the Delta operator's autograd Function runs unchanged on the folded batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


class EnsembleLinear(nn.Module):
    """``S`` linear layers over a folded batch: rows ``[s·n, (s+1)·n)`` go through layer ``s``.

    ``weight`` is ``(S, out, in)`` and ``bias`` ``(S, out)``: member ``s``'s slice has the
    layout of its own :class:`~torch.nn.Linear`.
    """

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))
        biases = [layer.bias for layer in layers]
        self.bias = (None if biases[0] is None
                     else nn.Parameter(torch.stack([b.detach() for b in biases])))

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(self.weight.shape[0], -1, x.shape[-1])  # (S, n·…, in)
        if self.bias is None:
            out = rows @ self.weight.mT
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), rows, self.weight.mT)
        return out.reshape(*x.shape[:-1], out.shape[-1])


#: The layers that can hold parameters in a folded ensemble, with their twin's factory.
TWINS: dict[type[nn.Module], Callable[[Sequence[nn.Module]], nn.Module]] = {
    nn.Linear: EnsembleLinear,
}


@dataclass
class Ensemble:
    """``members`` run as ``module`` on member-major folded batches.

    In an ensemble of several, every parameter of ``module`` has the member axis first;
    :meth:`export` writes member ``s``'s current weights back into ``members[s]``.
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
    be built: a layer holding parameters or buffers has no twin in :data:`TWINS`, or the
    model's outputs for one sample depend on others (``samples_independent`` False, as for
    an adaptive ODE solve, whose step sizes the whole batch shares). A model whose ops mix
    only the rows of one member may fold all the same: it says so with
    ``members_independent`` and is told the ensemble's size in its ``members``.

    A model folds correctly only where every op but its twinned layers acts per sample and
    keeps the batch on the first axis; callers compare a folded forward with the members'
    own before trusting it.
    """
    first = models[0]
    if len(models) == 1:
        return alone(first)
    if not getattr(first, "members_independent", getattr(first, "samples_independent", True)):
        return None
    skeleton = copy.deepcopy(first)
    if getattr(skeleton, "members_independent", False):
        skeleton.members = len(models)
    paths = [dict(m.named_modules(remove_duplicate=False)) for m in models]
    twins: dict[int, nn.Module] = {}
    slots: list[tuple[nn.Parameter, list[nn.Parameter]]] = []
    for path, module in list(skeleton.named_modules(remove_duplicate=False)):
        if not (module._parameters or module._buffers):
            continue
        twin_of = TWINS.get(type(module))
        if twin_of is None:
            return None
        if id(module) not in twins:  # a layer shared by several paths gets one twin
            layers = [p[path] for p in paths]
            twins[id(module)] = twin = twin_of(layers)
            slots += [(param, [getattr(layer, name) for layer in layers])
                      for name, param in twin.named_parameters()]
        parent, _, name = path.rpartition(".")
        setattr(skeleton.get_submodule(parent), name, twins[id(module)])
    return Ensemble(skeleton, list(models), slots)
