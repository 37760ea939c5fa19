"""The task interface: a frozen spec plus a deterministic sampler.

A task says what the model sees (inputs, optional per-step controls), what it must
produce (the final output, or one output per depth step), how that is scored, and which
gate regime of the Delta operator it probes. Built-in tasks live in the top-level
``tasks/`` folder (imported as ``ddl_dynamics.tasks``, which the registry loads on its first
lookup: the package's root names it); a user adds one with `register_task` in a single
file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ._registry import Registry

TASKS: Registry[Task] = Registry("task", entry_point_group="ddl_dynamics.tasks")

Loss = Literal["mse", "bce", "ce"]
Metric = Literal["mse", "accuracy", "bpc"]
#: The ``"long"`` OOD split runs this many times the training depth (length extrapolation).
LONG_FACTOR = 4
#: The splits drawn from the training distribution; OOD splits follow them.
IN_DISTRIBUTION = ("train", "val", "test")
#: Shares of a finite content space that `held_out` keeps for val and for test.
HELD_OUT = {"val": 0.1, "test": 0.2}
#: The largest share of val or test examples whose content may also occur in train.
MAX_OVERLAP = 0.01
#: The target of a sequence position that is not scored (cross-entropy's ignore index).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class TaskData:
    """One sampled split.

    Attributes:
        inputs: ``(n, in_dim)``, fed to the encoder.
        targets: ``(n, out_dim)`` when the task supervises the final state, or
            ``(n, steps, out_dim)`` when it supervises every depth step.
        steps: how many depth steps the model takes on this split (OOD splits may ask more).
        controls: ``(n, steps, control_dim)``; row ``l`` is fed at depth step ``l``.
        trajectory: ground-truth depth trajectory ``(n, steps + 1, ·)``, for figures.
        step_regimes: ``(n, steps)`` integers: where the exact step is one Delta update, the
            index in ``REGIMES`` of its gate's regime, else −1 (e.g. a smooth flow step); for
            figures that ask whether the trained gates follow the task's events.
    """

    inputs: Tensor
    targets: Tensor
    steps: int
    controls: Tensor | None = None
    trajectory: Tensor | None = None
    step_regimes: Tensor | None = None

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def for_training(self) -> TaskData:
        """The split without what only figures and probes read (``trajectory``,
        ``step_regimes``), which every minibatch would otherwise gather (a folded row of 8
        seeds trained 4–7% faster without)."""
        return dataclasses.replace(self, trajectory=None, step_regimes=None)

    def subset(self, index: Tensor | slice) -> TaskData:
        """The same split restricted to the rows ``index`` (a minibatch)."""

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index]

        return dataclasses.replace(
            self,
            inputs=self.inputs[index],
            targets=self.targets[index],
            controls=pick(self.controls),
            trajectory=pick(self.trajectory),
            step_regimes=pick(self.step_regimes),
        )


@dataclass(frozen=True)
class Subject:
    """A model a claim is about: a registered family and the option values that single it
    out among a run's entries (e.g. ``Subject("ddl", {"tied": True, "beta_max": 1.0})``).

    Options left unstated are the family's defaults wherever a run's entries of the family
    differ; sizes (``width``, ``depth``, ``hidden``) are the experiment's and never count.
    """

    family: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{self.family} ({options})" if options else self.family


@dataclass(frozen=True)
class Expectation:
    """A claim that ``model`` is ``relation`` (better or worse) than ``control`` on a split's
    metric, with the reason it should hold (cite the literature it rests on in prose).

    ``control`` is another model, compared paired over the seeds both finished, or a number:
    an analytic bound (e.g. the best MSE an order-preserving map can reach), compared with
    the one-sample test. Either way the verdict needs at least 3 paired finished seeds and
    p < 0.05. A claim on an out-of-distribution split must state ``requires``: the test
    metric the model has to reach on every finished seed (it must succeed in distribution
    before its extrapolation means anything). A family name stands for a `Subject`
    without options.
    """

    model: Subject | str
    relation: Literal["better", "worse"]
    control: Subject | str | float
    reason: str
    split: str = "test"
    requires: float | None = None

    def __post_init__(self) -> None:
        for name in ("model", "control"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Subject(getattr(self, name)))
        if self.relation not in ("better", "worse"):
            raise ValueError(f"relation must be 'better' or 'worse', got {self.relation!r}")
        if self.split != "test" and self.requires is None:
            raise ValueError(
                f"a claim on split {self.split!r} must state `requires`, the test "
                "metric the model has to reach in distribution first"
            )


def split_generator(seed: int, split: str) -> torch.Generator:
    """A CPU generator for ``(seed, split)``: the same stream on any machine, and distinct
    streams for different splits. Never touches global RNG. Distinct streams keep splits of
    a continuous input space apart; a finite one also needs `held_out`."""
    return torch.Generator().manual_seed(zlib.crc32(f"{split}/{seed}".encode()))


def content_split(rows: Tensor) -> list[str]:
    """The in-distribution split that owns each row's content: ``"val"`` or ``"test"`` for
    the `HELD_OUT` shares of all possible contents, else ``"train"``; a fixed hash of
    the row's bytes decides, the same for every seed and machine."""
    owners = []
    for row in rows.flatten(1):
        digest = hashlib.blake2b(row.cpu().numpy().tobytes(), digest_size=8).digest()
        position, bound = int.from_bytes(digest, "big") / 2**64, 0.0
        for split, share in HELD_OUT.items():
            bound += share
            if position < bound:
                owners.append(split)
                break
        else:
            owners.append("train")
    return owners


def held_out(draw: Callable[[int], Tensor], n: int, split: str, rounds: int = 100) -> Tensor:
    """``n`` rows of ``draw(m)`` (``m`` candidate rows from a seeded generator) whose content
    belongs to ``split`` (`content_split`), in the order drawn.

    A task with a finite input space samples through this, so that no val or test input
    ever occurs in train; OOD splits (new by construction, e.g. longer) keep every row.
    """
    if split not in IN_DISTRIBUTION:
        return draw(n)
    kept, found = [], 0
    for _ in range(rounds):
        rows = draw(max(2 * n, 256))
        mine = rows[torch.tensor([owner == split for owner in content_split(rows)])]
        kept.append(mine)
        found += len(mine)
        if found >= n:
            return torch.cat(kept)[:n]
    raise ValueError(
        f"found {found} of {n} {split} examples in {rounds} rounds of draws: the "
        "input space is too small to hold out a share for every split"
    )


def content_overlap(task: Task, split: str, n: int = 256, seed: int = 0) -> float:
    """The share of ``n`` examples of ``split`` whose content (inputs and controls) also
    occurs among ``n`` training examples of the same seed."""
    return shared_content(task.sample(n, seed, "train"), task.sample(n, seed, split))


def shared_content(train: TaskData, other: TaskData) -> float:
    """The share of the examples of ``other`` whose content (inputs and controls) also
    occurs among the examples of ``train``."""

    def contents(data: TaskData) -> list[bytes]:
        parts = [data.inputs] + ([] if data.controls is None else [data.controls])
        rows = torch.cat([p.flatten(1) for p in parts], dim=1).cpu().contiguous()
        raw, width = rows.numpy().tobytes(), rows.shape[1] * rows.element_size()
        return [raw[i * width : (i + 1) * width] for i in range(len(rows))]

    seen = set(contents(train))
    return sum(row in seen for row in contents(other)) / max(1, len(other))


@dataclass(frozen=True)
class Task(ABC):
    """Base class of every task: subclass as a frozen dataclass and register it.

    Class attributes describe the task; dataclass fields are its tunable spec (overridable
    from experiment files). ``depth`` is the number of depth steps of the train, val and
    test splits; out-of-distribution splits (``ood_splits``) may use more. Train, val and
    test are disjoint by content: a task with a finite input space samples through
    `held_out`.
    """

    #: Depth steps of the train, val and test splits (a spec field: an experiment file can
    #: set it); an OOD split may take more (`split_steps`).
    depth: int = 8

    #: The gate regime (or limitation) the task probes, in one line.
    regime: ClassVar[str] = ""
    #: The gate regimes (names in ``REGIMES``) a Delta stack should use to solve the task;
    #: empty for control tasks. The report compares them with the regimes actually used.
    regimes: ClassVar[tuple[str, ...]] = ()
    #: ``"vector"`` tasks feed vector-state depth models; ``"sequence"`` tasks Transformers.
    kind: ClassVar[str] = "vector"
    #: The training loss: ``"mse"``, ``"bce"`` (binary targets) or ``"ce"`` (class ids, as a
    #: sequence task's targets are).
    loss_name: ClassVar[Loss] = "mse"
    #: The reported metric: ``"mse"`` or ``"bpc"`` (bits per character), lower is better;
    #: ``"accuracy"``, higher is better.
    metric_name: ClassVar[Metric] = "mse"
    #: ``"final"``: targets are ``(n, out_dim)``; ``"trajectory"``: ``(n, steps, out_dim)``.
    supervise: ClassVar[Literal["final", "trajectory"]] = "final"
    #: The names of the state's coordinates (``("q", "p")`` for a phase plane), for figure
    #: axes; None: ``x1``, ``x2``, ….
    state_names: ClassVar[tuple[str, ...] | None] = None
    #: Out-of-distribution splits, scored once after training beside test (e.g.
    #: ``("long",)``: `LONG_FACTOR` times the depth); `sample` must accept each.
    ood_splits: ClassVar[tuple[str, ...]] = ()
    #: Model-config defaults the task needs (e.g. an identity encoder for 1-D flows).
    model_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Claims about models on this task, each an `Expectation` with its reason: every report
    #: that ran both sides tests them as comparisons (confirmed, contradicted or open).
    expectations: ClassVar[tuple[Expectation, ...]] = ()
    #: The spec field that moves the task from one regime to another (e.g. an event rate),
    #: the x-axis of the crossover figure when an experiment sweeps it; None: no such knob.
    knob: ClassVar[str | None] = None
    #: Whether each query reads a chain of earlier positions, one per hop, that
    #: `hop_positions` names: the hop audit then reads the Delta rows' gates there.
    has_hops: ClassVar[bool] = False
    #: ``(relative, absolute)``: two models whose test metrics differ by less than
    #: ``max(relative · |control's mean|, absolute)`` are practically equal, the margin of
    #: the report's equivalence test. None: 10% of an MSE (at least 1e-4, for values near
    #: zero), one point of accuracy. A task whose metric has a natural scale states its own.
    margin: ClassVar[tuple[float, float] | None] = None

    @property
    @abstractmethod
    def in_dim(self) -> int: ...

    @property
    @abstractmethod
    def out_dim(self) -> int: ...

    @property
    def control_dim(self) -> int:
        return 0

    @property
    def splits(self) -> tuple[str, ...]:
        return (*IN_DISTRIBUTION, *self.ood_splits)

    @abstractmethod
    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        """``n`` examples of ``split``; a pure function of ``(spec, n, seed, split)``."""

    @property
    def higher_is_better(self) -> bool:
        return self.metric_name == "accuracy"

    @property
    def floor(self) -> float | None:
        """The metric's chance or shortcut level: what a model that does not do the task
        scores (a random class, or the best guess that skips the task's step, such as
        answering a chain's query with some chain's start value); None where no such level
        is well defined. Two rows at it on every seed read "both at floor": no test, and a
        claim on them stays open. A task overrides this property, derived from its spec."""
        return None

    def hop_positions(self, inputs: Tensor) -> Tensor:
        """Per token ``(n, T, hops)``: at a query, the position each hop reads; −1 at every
        other token. A task with `has_hops` defines it."""
        raise NotImplementedError(f"{type(self).__name__} has no hops (has_hops is False)")

    @property
    def margin_terms(self) -> tuple[float, float]:
        """``(relative, absolute)`` of `equivalence_margin`: `margin`, or the default."""
        return self.margin or ((0.0, 0.01) if self.metric_name == "accuracy" else (0.1, 1e-4))

    def equivalence_margin(self, control_mean: float) -> float:
        """The largest difference from a control with this mean that counts as none."""
        relative, absolute = self.margin_terms
        return max(relative * abs(control_mean), absolute)

    def loss(self, pred: Tensor, target: Tensor) -> Tensor:
        if self.loss_name == "ce":  # logits (..., classes) against class ids (...)
            return F.cross_entropy(pred.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX)
        if self.loss_name == "bce":
            return F.binary_cross_entropy_with_logits(pred, target)
        return F.mse_loss(pred, target)

    def member_losses(self, preds: Tensor, targets: Tensor) -> Tensor:
        """Each member's `loss` on its rows, ``(S,)``, for the members' predictions and
        targets stacked ``(S, n, …)``: computed for all members at once (a folded ensemble's
        step pays per op), or member by member where a task overrides `loss`."""
        if type(self).loss is not Task.loss:
            return torch.stack([self.loss(p, t) for p, t in zip(preds, targets, strict=True)])
        if self.loss_name == "ce":  # the mean over each member's scored positions
            each = F.cross_entropy(
                preds.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
            )
            scored = (targets != IGNORE_INDEX).flatten(1).sum(1)
            return each.view(len(preds), -1).sum(1) / scored
        if self.loss_name == "bce":
            each = F.binary_cross_entropy_with_logits(preds, targets, reduction="none")
        else:
            each = (preds - targets).square()
        return each.flatten(1).mean(1)

    def metric(self, pred: Tensor, target: Tensor) -> float:
        """The headline metric: MSE; or accuracy of logits against 0/1 labels, or of the
        argmax of class logits against class ids on the scored positions."""
        if self.metric_name == "accuracy" and not target.is_floating_point():
            scored = target != IGNORE_INDEX
            return (pred.argmax(-1) == target)[scored].float().mean().item()
        if self.metric_name == "accuracy":
            return ((pred > 0).to(target.dtype) == target).float().mean().item()
        return F.mse_loss(pred, target).item()

    def extra_metrics(self, pred: Tensor, data: TaskData) -> dict[str, float]:
        """Task-specific figures beside the metric (e.g. energy drift); none by default."""
        return {}

    def split_steps(self, split: str) -> int:
        """Depth steps of ``split`` (checked): ``depth``, or ``LONG_FACTOR · depth`` on ``long``."""
        self.check_split(split)
        return self.depth * LONG_FACTOR if split == "long" else self.depth

    def check_split(self, split: str) -> None:
        """Refuse a split the task does not have (a ``ValueError`` naming its splits): the
        first line of a `sample`."""
        if split not in self.splits:
            raise ValueError(
                f"task {type(self).__name__} has no split {split!r}; splits: {self.splits}"
            )


@dataclass(frozen=True)
class SequenceTask(Task):
    """Base class of token-sequence tasks, run by the Transformer families.

    ``sample`` returns int64 tokens ``(n, T)`` in ``[0, in_dim)`` as inputs and int64 targets
    ``(n, T)`` in ``[0, out_dim)``, `IGNORE_INDEX` where nothing is scored; the model
    gives logits at every position (cross-entropy and accuracy on the scored positions).
    ``steps`` is the sequence length: ``length`` on train, val and test,
    ``length_factors[split]`` times it on an OOD split. ``depth`` is the model's number of
    blocks; the task ignores it. A subclass draws sequences (`tokens`) and answers them
    (`answers`); `sample` holds whole sequences out by split (`held_out`).
    """

    length: int = 64

    kind: ClassVar[str] = "sequence"
    loss_name: ClassVar[Loss] = "ce"
    metric_name: ClassVar[Metric] = "accuracy"
    supervise: ClassVar[Literal["final", "trajectory"]] = "trajectory"
    #: OOD split → how many times ``length`` it runs; list the same names in ``ood_splits``.
    length_factors: ClassVar[Mapping[str, int]] = {}

    def split_steps(self, split: str) -> int:
        """The sequence length of ``split`` (checked)."""
        self.check_split(split)
        return self.length * self.length_factors.get(split, 1)

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        """``n`` sequences of `tokens`, whole sequences held out by split, with their
        `answers`."""
        T = self.split_steps(split)
        g = split_generator(seed, split)
        inputs = held_out(lambda m: self.tokens(m, T, g), n, split)
        return TaskData(inputs=inputs, targets=self.answers(inputs), steps=T)

    @abstractmethod
    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        """``n`` input sequences of length ``T``, int64 ``(n, T)``, drawn from ``g``."""

    @abstractmethod
    def answers(self, tokens: Tensor) -> Tensor:
        """The targets of ``tokens``: int64 ``(n, T)``, `IGNORE_INDEX` where unscored."""


def register_task(name: str, task: type[Task] | None = None) -> Any:
    """Register a `Task` subclass under ``name`` (also as ``@register_task("name")``)."""
    return TASKS.register(name, task)


def make_task(name: str, **spec: Any) -> Task:
    """Build a registered task, overriding spec fields by keyword."""
    cls = TASKS.get(name)
    known = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    unknown = sorted(set(spec) - known)
    if unknown:
        from ._registry import did_you_mean

        raise ValueError(
            f"task {name!r} has no option {unknown[0]!r}; options: {', '.join(sorted(known))}."
            + did_you_mean(unknown[0], sorted(known))
        )
    return cls(**spec)


def list_tasks() -> list[str]:
    return TASKS.names()
