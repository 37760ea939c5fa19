"""The depth-model interface: encoder → L depth steps → decoder, one registry for all families.

Every family shares the encoder, the decoder, the optional zero-padding of the state and the
small branch MLP defined here, so that two families differ only in their depth dynamics.
"""

from __future__ import annotations

import inspect
import typing
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from .._checks import check_choice, check_int
from .._registry import Registry, did_you_mean

#: The families: the built-in ones (each module of this package registers its models when
#: imported, which the registry does on its first lookup), then any a user adds.
MODELS: Registry[Model] = Registry("model", entry_point_group="ddl_dynamics.models")

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "silu": nn.SiLU}
CODECS = ("linear", "identity")


def join(state: Tensor, u_i: Tensor | None) -> Tensor:
    """The context ``[state; u_l]`` every branch reads, ``(B, state_dim + control_dim)``."""
    return state if u_i is None else torch.cat([state, u_i], dim=-1)


def last(items: Iterable[Tensor]) -> Tensor:
    """The last of ``items``, consumed without keeping the others."""
    return deque(items, maxlen=1)[0]


def members_first(weight: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` ``(S·n, …)`` as ``(S, n, …)``, and the stacked ``weight`` ``(S, *shape)`` viewed to
    broadcast against it along the trailing axes: ``(S, 1, …, 1, *shape)``."""
    shape = weight.shape[1:]
    rows = x.unflatten(0, (weight.shape[0], -1))
    return rows, weight.view(weight.shape[0], *(1,) * (rows.dim() - 1 - len(shape)), *shape)


class Branch(nn.Module):
    """The small MLP of every family, ``[state; u_l] → hidden → out``."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, activation: str = "tanh") -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.act = ACTIVATIONS[check_choice("activation", activation, list(ACTIVATIONS))]()
        self.out = nn.Linear(hidden, out_dim)

    def forward(self, z: Tensor) -> Tensor:
        return self.out(self.act(self.inp(z)))


class FirstCoordinates(nn.Module):
    """The identity decoder: reads the first ``n`` coordinates of the state."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, z: Tensor) -> Tensor:
        return z[..., : self.n]


class Model(nn.Module):
    """What every family is, the depth models and the Transformers alike: a module that
    declares what it can do in class attributes, its traits, which the trainer, the grid, the
    probes and the report read from the registered class (`family`) instead of probing for
    methods. A family sets those that differ from the defaults where it is defined.
    """

    #: ``"vector"``: a vector through depth steps (`DepthModel`); ``"sequence"``: tokens in,
    #: logits at every position out. A model runs on the tasks of its kind.
    kind: ClassVar[str] = "vector"
    #: Whether it solves an ODE, counting its vector-field evaluations per member
    #: (``nfe_forward``, ``nfe_backward``) since ``reset_nfe()``; the trainer records them.
    solves_ode: ClassVar[bool] = False
    #: Whether it has ``probe``, which returns what its gates did on a batch, layer by layer
    #: (a `DeltaProbe`): the probes keep it and the gate figures draw it.
    probes: ClassVar[bool] = False
    #: Whether its update erases along the direction it writes, so that its gate β sets the
    #: eigenvalue ``1 − β`` of the step along k: only then do the gate regimes (identity,
    #: projection, reflection) apply, and the report tabulates and audits them. Needs
    #: `probes`.
    erases: ClassVar[bool] = False
    #: Whether it mixes several residual streams by learned matrices (Hyper-Connections) and
    #: has ``stream_mixing()``, each layer's static mixing matrix ``(depth, n, n)``: the
    #: report audits how far training moved it from the identity and from its start.
    mixes_streams: ClassVar[bool] = False
    #: Options the family gained after studies stored its cells, each with the value that
    #: reproduces the family as it was: a cell's key leaves the option out at that value
    #: (`Cell.to_dict`), so that the stored cells keep their keys and a rerun resumes them.
    late_options: ClassVar[Mapping[str, Any]] = {}
    #: Its folded training step's time eager over compiled (``ddl-dyn bench --parts
    #: compile``, ``transformer``): ``train.compile = "auto"`` compiles a family only where
    #: this is above 1, and then only where the steps left repay the compile.
    compile_gain: ClassVar[float] = 1.0
    #: The members whose batches a folded ensemble of this model concatenates, member by
    #: member (set by `fold`); read by a model whose ops mix the rows of one member.
    members: int = 1
    in_dim: int
    out_dim: int
    depth: int

    @property
    def samples_independent(self) -> bool:
        """Whether each sample's output depends on that sample alone: no op mixes the batch,
        so models' batches can be concatenated and computed as one."""
        return True

    @property
    def members_independent(self) -> bool:
        """Whether each member's rows of a folded batch depend on that member's alone: an
        ensemble of this model folds (`fold`)."""
        return self.samples_independent

    @property
    def can_extrapolate(self) -> bool:
        """Whether the model can run more steps (or tokens) than it was built for."""
        return False


class DepthModel(Model):
    """Base class of the vector depth models: encoder → ``depth`` steps → decoder.

    Every family uses this encoder, decoder and state padding, so only the depth dynamics
    differ between families. Discrete families implement `step` (and build their
    per-step modules with `per_layer`); a family whose steps are not one state to the next
    (an ODE solve, hyper-connections' streams) overrides `states` instead.

    Args:
        in_dim: input size. out_dim: output size.
        control_dim: size of the per-step controls ``u_l`` (0: none).
        width: size of the encoded state.
        depth: number of depth steps ``L`` (layers; for an ODE, ``L`` intervals of ``T/L``).
        hidden: hidden size of the branch MLPs.
        tied: one set of weights for every step (a time-invariant map that can run any
            number of steps); otherwise one per step.
        encoder: ``"linear"`` (``in_dim → width``) or ``"identity"`` (needs ``in_dim == width``).
        decoder: ``"linear"`` (``state_dim → out_dim``) or ``"identity"`` (the first
            ``out_dim`` coordinates of the state).
        activation: of the branch MLPs, ``"tanh"`` or ``"silu"``.
        augment_dim: zeros appended to the encoded state (``state_dim = width + augment_dim``),
            as in Augmented Neural ODEs (Dupont et al. 2019).
    """

    layers: nn.ModuleList

    def __init__(
        self,
        *,
        in_dim: int,
        out_dim: int,
        control_dim: int = 0,
        width: int = 32,
        depth: int = 8,
        hidden: int = 32,
        tied: bool = False,
        encoder: str = "linear",
        decoder: str = "linear",
        activation: str = "tanh",
        augment_dim: int = 0,
    ) -> None:
        super().__init__()
        self.in_dim = check_int("in_dim", in_dim, 1)
        self.out_dim = check_int("out_dim", out_dim, 1)
        self.control_dim = check_int("control_dim", control_dim, 0)
        self.width = check_int("width", width, 1)
        self.depth = check_int("depth", depth, 1)
        self.hidden = check_int("hidden", hidden, 1)
        self.augment_dim = check_int("augment_dim", augment_dim, 0)
        self.activation = check_choice("activation", activation, list(ACTIVATIONS))
        if not isinstance(tied, bool):
            raise ValueError(f"tied must be True or False, got {tied!r}")
        self.tied = tied
        if check_choice("encoder", encoder, CODECS) == "identity" and in_dim != width:
            raise ValueError(f"identity encoder needs in_dim == width, got {in_dim} != {width}")
        self.encoder = nn.Linear(in_dim, width) if encoder == "linear" else nn.Identity()
        if check_choice("decoder", decoder, CODECS) == "identity" and out_dim > self.state_dim:
            raise ValueError(
                f"identity decoder reads out_dim={out_dim} coordinates of a state of size "
                f"{self.state_dim}"
            )
        self.decoder = (
            nn.Linear(self.state_dim, out_dim) if decoder == "linear" else FirstCoordinates(out_dim)
        )

    @property
    def state_dim(self) -> int:
        return self.width + self.augment_dim

    @property
    def can_extrapolate(self) -> bool:
        """Whether the model can run more steps than ``depth`` (tied weights or an ODE)."""
        return self.tied

    def per_layer(self, build: Callable[[], nn.Module]) -> nn.ModuleList:
        """``depth`` independent modules from ``build``, or one shared module when tied."""
        return nn.ModuleList(build() for _ in range(1 if self.tied else self.depth))

    def layer(self, i: int) -> nn.Module:
        """The module of step ``i`` (the shared one when tied)."""
        return self.layers[0 if self.tied else i]

    def branch(self, in_dim: int, out_dim: int) -> Branch:
        """A branch MLP with this model's hidden size and activation."""
        return Branch(in_dim, self.hidden, out_dim, self.activation)

    def encode(self, x: Tensor) -> Tensor:
        """``(B, in_dim) → (B, state_dim)``: the encoder, then ``augment_dim`` zeros."""
        z = self.encoder(x)
        return nn.functional.pad(z, (0, self.augment_dim)) if self.augment_dim else z

    def decode(self, states: Tensor) -> Tensor:
        """The decoder over the last axis, ``(..., state_dim) → (..., out_dim)``."""
        return self.decoder(states)

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        """Depth step ``i``, ``(B, state_dim) → (B, state_dim)``; ``u_i``: ``(B, control_dim)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement step or states")

    def forward(
        self, x: Tensor, u: Tensor | None = None, steps: int | None = None, per_step: bool = False
    ) -> Tensor:
        """The decoded final state ``(B, out_dim)``, or every step's ``(B, steps, out_dim)``.

        Decodes the states as `states` yields them, not a slice of the stacked `trajectory`,
        whose backward would fill a zero gradient for every state the slice leaves out and
        add it in (training steps measured 1–15% faster without, the most at 24 folded
        seeds)."""
        states = self.states(x, u, steps)
        if not per_step:
            return self.decode(last(states))
        next(states)  # the encoded input, before the first step
        return self.decode(torch.stack(list(states), dim=1))

    def trajectory(self, x: Tensor, u: Tensor | None = None, steps: int | None = None) -> Tensor:
        """The hidden states before and after every step, ``(B, steps + 1, state_dim)``.

        Args:
            x: ``(B, in_dim)``.
            u: ``(B, steps, control_dim)``, row ``i`` fed at step ``i``; required iff
                ``control_dim > 0``.
            steps: defaults to ``u.shape[1]`` when controls are given, else ``depth``.
        """
        return torch.stack(list(self.states(x, u, steps)), dim=1)

    def states(
        self, x: Tensor, u: Tensor | None = None, steps: int | None = None
    ) -> Iterator[Tensor]:
        """The hidden states before and after every step, one at a time, ``(B, state_dim)``
        each (arguments as for `trajectory`)."""
        steps = self.resolve_steps(x, u, steps)
        state = self.encode(x)
        yield state
        for i in range(steps):
            state = self.step(i, state, None if u is None else u[:, i])
            yield state

    def resolve_steps(self, x: Tensor, u: Tensor | None, steps: int | None) -> int:
        """Validate the inputs of a call; return the number of steps to take."""
        name = type(self).__name__
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"{name}: x must be (batch, {self.in_dim}), got {tuple(x.shape)}")
        if u is None and self.control_dim:
            raise ValueError(f"{name} needs controls u of shape (batch, steps, {self.control_dim})")
        if u is not None and not self.control_dim:
            raise ValueError(f"{name}: controls u given but the model has control_dim=0")
        if u is not None and u.dim() != 3:
            raise ValueError(
                f"{name}: u must be (batch, steps, {self.control_dim}), got {tuple(u.shape)}"
            )
        if steps is None:
            steps = self.depth if u is None else u.shape[1]
        steps = check_int("steps", steps, 1)
        if steps > self.depth and not self.can_extrapolate:
            raise ValueError(
                f"{name} has {self.depth} untied layers and cannot run {steps} steps; "
                "use tied=True to extrapolate in depth"
            )
        if u is not None and tuple(u.shape) != (x.shape[0], steps, self.control_dim):
            raise ValueError(
                f"{name}: u must be {(x.shape[0], steps, self.control_dim)} for {steps} steps, "
                f"got {tuple(u.shape)}"
            )
        return steps


def register_model(name: str, model: type[Model] | None = None) -> Any:
    """Register a model class under ``name`` (also as ``@register_model("name")``): a subclass
    of `Model` (as `DepthModel`), whose traits say what the family can do."""

    def add(cls: type[Model]) -> type[Model]:
        MODELS.register(name, _declared(name, cls))
        return cls

    return add(model) if model is not None else add


def family(name: str) -> type[Model]:
    """The class registered as ``name`` (or given as ``"module:Name"``), whose traits say what
    the family can do."""
    return _declared(name, MODELS.get(name))


def _declared(name: str, factory: object) -> type[Model]:
    """``factory`` if it is a `Model` subclass, else a ``ValueError``: only a class declares
    the traits that the trainer and the analysis read."""
    if not (isinstance(factory, type) and issubclass(factory, Model)):
        raise ValueError(
            f"model {name!r} is {factory!r}, not a subclass of "
            "ddl_dynamics.models.base.Model (such as DepthModel), so it declares "
            "none of the traits a family has"
        )
    return factory


def model_options(name: str) -> dict[str, tuple[Any, Any]]:
    """``option → (default, type hint)`` of a registered model.

    Follows ``**options`` pass-through up a class's bases, so that options a family hands
    on to `DepthModel` are found too. A model declares its options by name: a
    keyword it only swallows through ``**kwargs`` is not one.
    """
    factory = MODELS.get(name)
    targets = (
        [vars(c)["__init__"] for c in factory.__mro__ if "__init__" in vars(c)]
        if isinstance(factory, type)
        else [factory]
    )
    options: dict[str, tuple[Any, Any]] = {}
    for target in targets:
        params = list(inspect.signature(target).parameters.values())
        try:
            hints = typing.get_type_hints(target)
        except (NameError, TypeError):
            hints = {}
        for p in params:
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self":
                default = None if p.default is p.empty else p.default
                options.setdefault(p.name, (default, hints.get(p.name)))
        if all(p.kind is not p.VAR_KEYWORD for p in params):
            break
    return options


def make_model(name: str, *, seed: int | None = None, **config: Any) -> Model:
    """Build a registered model; unknown options fail with the list of valid ones.

    With ``seed``, the initialisation is that of ``torch.manual_seed(seed)`` (as the
    experiments build their cells), without touching the caller's random state; without
    it, the global generator draws it.
    """
    options = sorted(model_options(name))
    unknown = sorted(set(config) - set(options))
    if unknown:
        raise ValueError(
            f"model {name!r} has no option {unknown[0]!r}; options: {', '.join(options)}."
            + did_you_mean(unknown[0], options)
        )
    if seed is None:
        return MODELS.get(name)(**config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS.get(name)(**config)


def list_models() -> list[str]:
    return MODELS.names()


def check_model(model: DepthModel, batch: int = 4, seed: int = 0) -> None:
    """Validate a vector model against the interface; raises ``ValueError`` naming the
    problem (also under ``python -O``). Run it on your own family: it checks output, per-step
    and trajectory shapes, finiteness, the traits it declares (`Model`), the
    depth-extrapolation contract, and that gradients reach every parameter.
    """
    name = type(model).__name__
    param = next(model.parameters(), None)
    like: dict[str, Any] = (
        {"dtype": param.dtype, "device": param.device} if param is not None else {}
    )
    gen = torch.Generator().manual_seed(seed)
    steps, b = model.depth, batch

    def draw(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen).to(**like)

    x = draw(b, model.in_dim)
    u = draw(b, steps, model.control_dim) if model.control_dim else None
    out = model(x, u)
    per_step = model(x, u, per_step=True)
    traj = model.trajectory(x, u)
    for label, t, want in (
        ("output", out, (b, model.out_dim)),
        ("per-step output", per_step, (b, steps, model.out_dim)),
        ("trajectory", traj, (b, steps + 1, model.state_dim)),
    ):
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: {label} {tuple(t.shape)} != {want}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name}: {label} has NaN/Inf")
    if not torch.allclose(model.decode(traj[:, -1]), out, atol=1e-5, rtol=1e-4):
        raise ValueError(f"{name}: forward output differs from the decoded last trajectory state")
    _check_traits(model, x, u)
    long = 2 * steps
    u_long = draw(b, long, model.control_dim) if model.control_dim else None
    if model.can_extrapolate:
        got = tuple(model(x, u_long, steps=long, per_step=True).shape)
        if got != (b, long, model.out_dim):
            raise ValueError(f"{name}: {long}-step output has shape {got}")
    else:
        try:
            model(x, u_long, steps=long)
        except ValueError:
            pass
        else:
            raise ValueError(f"{name}: cannot extrapolate but ran {long} > depth steps")
    params = [p for p in model.parameters() if p.requires_grad]
    loss = out.square().sum() + per_step.square().sum()
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, g in zip(params, grads, strict=True):
        if g is None:
            raise ValueError(f"{name}: no gradient reaches parameter {names[id(p)]}")
        if not torch.isfinite(g).all():
            raise ValueError(f"{name}: gradient of {names[id(p)]} has NaN/Inf")


def _check_traits(model: DepthModel, x: Tensor, u: Tensor | None) -> None:
    """What a vector model's traits promise holds on ``x`` and ``u``: its kind is vector, a
    model that erases is probed, a probe gives each sample its gates, a stream mixer gives
    each layer a square mixing matrix, an ODE counts its evaluations."""
    name, found = type(model).__name__, cast(Any, model)
    if model.kind != "vector":
        raise ValueError(
            f"{name}: a DepthModel runs vector tasks: kind 'vector', not {model.kind!r}"
        )
    if model.erases and not model.probes:
        raise ValueError(
            f"{name}: erases = True needs probes = True and a probe method: the "
            "gate regimes are read from its probe"
        )
    if model.probes:
        beta = found.probe(x, u).beta
        if beta.shape[0] != x.shape[0] or not torch.isfinite(beta).all():
            raise ValueError(
                f"{name}: its probe's gates {tuple(beta.shape)} are not finite "
                f"values for each of the {x.shape[0]} samples"
            )
    if model.mixes_streams:
        mixing = found.stream_mixing()
        if (
            mixing.dim() != 3
            or mixing.shape[0] != model.depth
            or mixing.shape[1] != mixing.shape[2]
            or not torch.isfinite(mixing).all()
        ):
            raise ValueError(
                f"{name}: mixes_streams = True needs stream_mixing(), finite "
                f"(depth={model.depth}, n, n), got {tuple(mixing.shape)}"
            )
    if model.solves_ode:
        found.reset_nfe()
        if len(found.nfe_forward) != model.members:
            raise ValueError(f"{name}: solves_ode = True needs nfe_forward, one count per member")
