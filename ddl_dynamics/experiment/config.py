"""Experiment configs: the frozen dataclasses an experiment file becomes.

An experiment lists tasks × models × seeds (`ExperimentConfig`); the TOML reader
(`reader`) checks a file and builds one, and `cells` expands it into
`Cell`s, each one task, model, train config and seed, fully resolved. This module
holds the values themselves and the rule for a value's type (`coerce`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import types
import typing
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .._registry import did_you_mean
from .._task import TASKS, Task, list_tasks, make_task
from ..models.base import Model, family, make_model
from .compiling import CompileMode

#: Model arguments a task fixes; an experiment may not set them.
TASK_DIMS = ("in_dim", "out_dim", "control_dim")
#: Statuses of a finished cell (a resumed run skips them); "failed" cells rerun.
FINISHED = ("ok", "diverged", "capped")
#: Statuses whose metrics enter statistics, figures and expectation checks. A capped,
#: diverged or failed cell is a failure of that model on that seed, never a result.
COUNTED = ("ok",)
#: The baseline of every row that names none, when the file has a model of this label.
DEFAULT_BASELINE = "resnet"
#: Seeds are stored as SQLite integers: 0 ≤ seed < SEED_LIMIT.
SEED_LIMIT = 2**63
#: The longest experiment name or label, in UTF-8 bytes: they name folders and files
#: (``runs/<name>``, ``regime_atlas_<label>.png``), which file systems cap at 255 bytes.
MAX_NAME = 200
#: Bounds beyond any sane run of this suite, which catch a typo (``steps = 10**30``,
#: ``width = 10**7``) before it trains for ever or fills the machine's memory: training
#: steps; examples per split or batch; layers; units per layer (``width``, ``hidden``);
#: parameters (16 bytes each to train: weights, gradients and AdamW's two moments).
#: Setting the environment variable `NO_LIMITS` lifts them, for a user who means it.
MAX_STEPS = 10**8
MAX_EXAMPLES = 10**7
MAX_DEPTH = 1000
MAX_WIDTH = 10**5
#: What `TrainConfig` checks of each bounded field, read by its check and by the generated
#: docs: ``positive`` (> 0) or ``non-negative`` (≥ 0), and the most any sane run takes (None:
#: no bound; `check_limit`). A field left at None is not checked.
TRAIN_BOUNDS: dict[str, tuple[str, int | None]] = {
    "steps": ("positive", MAX_STEPS),
    "batch_size": ("positive", MAX_EXAMPLES),
    "lr": ("positive", None),
    "weight_decay": ("non-negative", None),
    "warmup": ("non-negative", None),
    "grad_clip": ("non-negative", None),
    "eval_every": ("positive", None),
    "n_train": ("positive", MAX_EXAMPLES),
    "n_test": ("positive", MAX_EXAMPLES),
    "n_val": ("positive", MAX_EXAMPLES),
    "max_seconds": ("positive", None),
    "ode_max_steps": ("positive", MAX_STEPS),
}
#: What `TrainConfig` asks of ``device``.
DEVICE_RULE = "must be 'cpu', 'cuda' or 'cuda:<index>'"
MAX_PARAMS = 10**9
#: Sequence length of any split, and tokens of a split's whole data (examples × length).
MAX_LENGTH = 10**5
MAX_TOKENS = 10**8
#: Cells one row trains per seed: combinations of its grid values, and of a task's sweep.
MAX_GRID = 10**4
NO_LIMITS = "DDL_DYNAMICS_NO_LIMITS"
#: Steps a tuned row's grid extends at most past the end its choice sits at, each at the
#: grid's own ratio (`extensions`). On by default: a choice at an end is no optimum (once,
#: 89% of tuned rows sat at one). Two: two steps of the usual half-decade grid reach a
#: decade past it, at most two grid values more for a row at an end and none for a row
#: inside.
EXTEND = 2


class ConfigError(ValueError):
    """An experiment file (or dict) is invalid; the message names file, key and fix.

    ``errors`` lists each problem found (one, unless `of` gathered several), so that a
    file with many mistakes is fixed in one pass."""

    def __init__(self, source: str, where: str, message: str) -> None:
        self.source, self.where = source, where
        self.errors: tuple[ConfigError, ...] = (self,)
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error listing every one of ``errors`` (each once, in order)."""
        unique = list({str(e): e for e in errors}.values())
        if len(unique) == 1:
            return unique[0]
        source = unique[0].source
        listed = "; ".join(
            f"({i}) {str(e).removeprefix(f'{source}: ')}" for i, e in enumerate(unique, 1)
        )
        combined = cls(source, "", f"{len(unique)} errors: {listed}")
        combined.errors = tuple(unique)
        return combined


def unknown_key(source: str, where: str, key: str, allowed: Sequence[str]) -> ConfigError:
    """The error for ``key``, not one of ``allowed`` at ``where``, with a did-you-mean hint."""
    return ConfigError(
        source,
        f"{where}.{key}" if where else key,
        f"unknown key; valid keys: {', '.join(allowed)}." + did_you_mean(key, list(allowed)),
    )


class ConfigWarning(UserWarning):
    """An experiment value that does not apply where one might expect it to."""


@dataclass(frozen=True)
class TrainConfig:
    """How one cell trains.

    ``n_train`` examples are sampled once per seed and reshuffled every epoch: a fixed
    training set is cheaper than fresh batches, deterministic, and gives a meaningful
    train metric. ``n_val`` (default ``n_test``) validation examples score the training
    curve and ``target_metric``, which stops training early once the val metric reaches
    it; the ``n_test`` test examples are scored once, at the end. ``warmup`` is a fraction
    of ``steps`` when below 1, else a step count. A cell's budget is work: ``steps``, and
    for ODE models ``ode_max_steps`` solver steps per solve. ``max_seconds`` is a safety
    net only; a cell stopped by it or by the solver cap is recorded as ``"capped"``, a
    failure. ``bf16`` turns on bfloat16 autocast on CUDA (ignored on CPU). ``compile`` runs
    each step's forward and losses through ``torch.compile``: ``"auto"`` (the default)
    where the saving expected over the cell's steps exceeds the compile's cost
    (`compiling.CompileChoice`), ``true`` or ``false`` always or never. It is how a cell
    trains, not its budget: a compiled step differs from an eager one by float rounding,
    which training amplifies, so set it where a rerun must match cell for cell.
    """

    steps: int = 1000
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup: float = 0.05
    grad_clip: float = 1.0
    eval_every: int = 100
    n_train: int = 4096
    n_test: int = 1024
    n_val: int | None = None
    target_metric: float | None = None
    max_seconds: float | None = None
    ode_max_steps: int | None = None
    device: str = "cpu"
    bf16: bool = False
    compile: CompileMode = "auto"

    def __post_init__(self) -> None:
        check_finite(self)
        if self.n_val is None:
            object.__setattr__(self, "n_val", self.n_test)
        for name, (sign, limit) in TRAIN_BOUNDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if value < 0 or (sign == "positive" and value == 0):
                raise ValueError(f"{name} must be {sign}, got {value}")
            if limit is not None:
                check_limit(f"{name} = {value}", value, limit)
        try:
            kind = torch.device(self.device).type
        except RuntimeError:  # e.g. "cpu:abc": every cell would fail on it
            kind = None
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device {DEVICE_RULE}, got {self.device!r}")

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup * self.steps) if self.warmup < 1 else int(self.warmup)


@dataclass(frozen=True)
class TaskEntry:
    name: str
    label: str
    spec: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    #: The label of the ``[[tasks]]`` entry a sweep expanded this one from ("": not swept).
    sweep: str = ""
    tune: dict[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    #: Task labels this entry runs on (empty: every applicable task).
    tasks: tuple[str, ...] = ()
    #: The label of the row this one is compared with (None: the file's default).
    baseline: str | None = None
    tune: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def runs(self, task: str) -> bool:
        """Whether this entry runs on the task entry labelled ``task``."""
        return not self.tasks or task in self.tasks


@dataclass(frozen=True)
class Override:
    """Model, train and tune options for the cells whose task and model labels match."""

    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def matches(self, task: str, model: str) -> bool:
        return (not self.tasks or task in self.tasks) and (not self.models or model in self.models)


@dataclass(frozen=True)
class ComparisonSpec:
    """A comparison the experiment declares beside each row's baseline: row ``model``
    against row ``control`` on the tasks both run (or ``tasks``), on ``split``'s metric.

    A comparison on another split than test (an out-of-distribution one) states
    ``requires``, the test metric both rows must reach on every seed first: a difference
    beyond the trained range means nothing between rows that did not fit it. It is one
    number where the comparison's tasks share a metric, else one per metric
    (``{accuracy = 0.99, mse = 0.01}``): 0.99 is a bar for an accuracy, not for an MSE.

    ``question`` is what the comparison asks, in words: a study page states it above the
    answer, which is generated from the comparison's label. It plays no part in training or
    in the test.

    ``control_larger`` declares the control larger on purpose, a baseline of more compute:
    rows of different sizes are then tested where the control has at least the model's
    parameters and forward FLOPs (a difference the model wins is not owed to size), and
    the comparison's note states both ratios.
    """

    model: str
    control: str
    tasks: tuple[str, ...] = ()
    split: str = "test"
    requires: float | dict[str, float] | None = None
    question: str = ""
    control_larger: bool = False

    def threshold(self, metric: str) -> float | None:
        """What ``requires`` asks of a task whose metric is ``metric`` (None: nothing)."""
        if isinstance(self.requires, dict):
            return self.requires.get(metric)
        return self.requires


@dataclass(frozen=True)
class Cell:
    """One unit of work: a task, a model, a train config and a seed, all fully resolved.

    ``key`` hashes everything here, so a result row is found again exactly when the
    same configuration is asked for again (changing a row's baseline or grid reruns it).
    A tuned row has one cell per seed and grid value: ``tune`` is the row's grid (field →
    values) and ``train`` holds this cell's values.
    """

    task: str
    task_label: str
    spec: dict[str, Any]
    model: str
    label: str
    config: dict[str, Any]
    train: TrainConfig
    seed: int
    #: The label of the row this one is compared with; None for a row that has none.
    baseline: str | None = None
    #: What ``match_params`` asked for (a model label or a count), and the parameter count
    #: it resolved to (``config["hidden"]`` is sized for it; `RunResult.params` is
    #: the count measured).
    match_params: str | int | None = None
    params_target: int | None = None
    tune: dict[str, list[Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The cell as its row stores it; ``compile`` only where true, and a model option
        added later only where it differs from the family's former behaviour
        (`Model.late_options`), so that a cell keeps the key it had before the field existed."""
        train = dataclasses.asdict(self.train)
        if train["compile"] is not True:  # a key from before "auto" stays the same
            del train["compile"]
        late = family(self.model).late_options
        config = {k: v for k, v in self.config.items() if k not in late or v != late[k]}
        return {**dataclasses.asdict(self), "config": config, "train": train}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cell:
        return cls(**{**data, "train": TrainConfig(**data["train"])})

    @property
    def key(self) -> str:
        return cell_key(self.to_dict())

    def build(self) -> tuple[Task, Model]:
        """The task and a freshly initialised model (``torch.manual_seed(seed)`` first)."""
        list_tasks()  # registers the built-in tasks in a fresh worker process
        task = make_task(self.task, **self.spec)
        torch.manual_seed(self.seed)
        model = make_model(
            self.model,
            in_dim=task.in_dim,
            out_dim=task.out_dim,
            control_dim=task.control_dim,
            **self.config,
        )
        return task, model


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment: build with `load_experiment` or
    `parse_experiment`, expand with `expand_cells`.

    ``extend`` (``[defaults.tune] extend``, default `EXTEND`) bounds how far a tuned row's
    grid grows past an end its choice sits at (`extensions`); 0 turns it off.
    """

    name: str
    seeds: tuple[int, ...]
    tasks: tuple[TaskEntry, ...]
    models: tuple[ModelEntry, ...]
    model_defaults: dict[str, Any] = field(default_factory=dict)
    train_defaults: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[Override, ...] = ()
    tune_defaults: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    comparisons: tuple[ComparisonSpec, ...] = ()
    extend: int = EXTEND
    #: The default baseline label as the file gives it (None: ``resnet`` if present).
    baseline: str | None = None
    description: str = ""
    source: str = "<dict>"
    text: str = ""


def cell_key(config: Mapping[str, Any] | Sequence[str]) -> str:
    """The key of a cell from its `Cell.to_dict` (or that dict as a row stores it), or
    of an ensemble from its cells' sorted keys."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def coerce(value: Any, default: Any, hint: Any) -> Any:
    """``value`` if it has the type of an option with this default and type hint (an int may
    stand for a float) and is finite, else ``ValueError`` saying what was expected."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    allowed, choices = _allowed(default, hint)
    plain = tuple(t for t in allowed or () if t not in {type(c) for c in choices or ()})
    if choices is not None and value not in choices and not isinstance(value, plain):
        also = f", or {' or '.join(t.__name__ for t in plain)}" if plain else ""
        raise ValueError(
            f"{value!r} is not one of {', '.join(map(repr, choices))}{also}."
            + did_you_mean(str(value), [str(c) for c in choices])
        )
    if allowed is None:
        return value
    if type(value) is int and float in allowed and int not in allowed:
        return float(value)
    if isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
        return value
    names = " or ".join(t.__name__ for t in allowed)
    raise ValueError(f"expected {names}, got {type(value).__name__} {value!r}")


def _allowed(default: Any, hint: Any) -> tuple[tuple[type, ...] | None, tuple[Any, ...] | None]:
    """The Python types an option accepts and, for ``Literal`` hints, its valid values."""
    args = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    choices = tuple(v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a))
    allowed = tuple(a for a in args if isinstance(a, type) and a is not type(None))
    allowed += tuple({type(c) for c in choices} - set(allowed))
    if not allowed and hint is None and default is not None:
        allowed = (type(default),)
    return allowed or None, choices or None


def check_seeds(seeds: Any) -> tuple[int, ...]:
    """``seeds`` as a tuple if it is a non-empty list of distinct integers
    0 ≤ seed < 2⁶³ (one cell per seed, stored as an SQLite integer); else ``ValueError``."""
    if not isinstance(seeds, list | tuple) or not seeds:
        raise ValueError(f"expected a non-empty list of integers, got {seeds!r}")
    for i, seed in enumerate(seeds):
        if type(seed) is not int or not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed {seed!r} is not an integer 0 ≤ seed < 2**63")
        if seed in seeds[:i]:
            raise ValueError(f"seed {seed} is given twice (each seed is one cell)")
    return tuple(seeds)


def check_name(value: str, what: str) -> str:
    """``value`` if it can name a file or folder as it is (``what`` says which it names):
    one path component (no ``/`` or ``\\``, not ``.``, ``..`` or empty) of at most
    `MAX_NAME` bytes, without control or format characters (a right-to-left override
    would show a name as another) and not blank; else ``ValueError``."""
    if value in ("", ".", "..") or "/" in value or "\\" in value:
        raise ValueError(
            f"{value!r} is not one path component ({what}): no '/', '\\' or '..', and not empty"
        )
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise ValueError(f"{value!r} has a control character ({what})")
    if any(unicodedata.category(c) == "Cf" for c in value):
        raise ValueError(f"{value!r} has an invisible format character ({what})")
    if not value.strip():
        raise ValueError(f"{value!r} is blank ({what})")
    size = len(value.encode())
    if size > MAX_NAME:
        raise ValueError(f"{value[:24]!r}… is {size} bytes long, over {MAX_NAME} ({what})")
    return value


def check_label(label: str) -> str:
    """``label`` if a task or model label can name figure files (`check_name`)."""
    return check_name(label, "a label names figure files")


def check_limit(what: str, value: int, limit: int, note: str = "") -> None:
    """``ValueError`` saying ``what`` is beyond any sane run when ``value`` exceeds ``limit``,
    unless `NO_LIMITS` is set."""
    if value > limit and os.environ.get(NO_LIMITS, "") in ("", "0"):
        raise ValueError(
            f"{what} is beyond any sane run (at most {limit:,}{note}); set "
            f"{NO_LIMITS}=1 if you mean it"
        )


def check_finite(config: Any) -> None:
    """Every float field of a dataclass is finite (NaN and ±inf are never meant)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{f.name} must be a finite number, got {value}")


def task_metrics(tasks: Sequence[TaskEntry]) -> dict[str, list[str]]:
    """The metrics of registered task entries, each with the labels that report it."""
    found: dict[str, list[str]] = {}
    for t in tasks:
        if t.name in TASKS:
            metric = typing.cast("type[Task]", TASKS.get(t.name)).metric_name
            found.setdefault(metric, []).append(t.label)
    return found


def too_deep(value: Any, levels: int, where: str = "") -> str | None:
    """The key path at which ``value`` nests more than ``levels`` tables or lists deep,
    or None (deeper data would exhaust Python's recursion when copied or hashed)."""
    if not isinstance(value, Mapping | list):
        return None
    if levels == 0:
        return where or "(top level)"
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, item in items:
        here = f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}".lstrip(".")
        if (found := too_deep(item, levels - 1, here)) is not None:
            return found
    return None
