"""Training throughput of the Transformer variants against the additive baseline at the same
width: the rows of the Transformer study (``experiments/transformer.toml``), read from it,
and the token compressor, which the study does not run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._task import SequenceTask
from ..experiment.batches import to_device
from ..experiment.config import TrainConfig
from ..experiment.reader import load_experiment
from ..models.base import make_model
from ..models.ensemble import alone
from ..models.params import count_parameters
from .steps import TrainingStep
from .timing import achieved_rates, timing

#: The Transformer study whose rows (its ``[[models]]``, the baseline first) are timed.
STUDY = Path(__file__).resolve().parents[2] / "experiments" / "transformer.toml"
#: Timed beside the study's rows: d_v = 4 with the token compressor (TC).
EXTRA_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddl-dv4-tc": ("ddl-transformer", {"value_channels": 4, "compressor": "token"}),
}


def transformer_variants(study: str | Path = STUDY) -> dict[str, tuple[str, dict[str, Any]]]:
    """label → (model name, options) of every row of ``study``, in its order, then
    `EXTRA_VARIANTS`; the options are the row's own (the file's defaults aside: the
    benchmark sets width and depth)."""
    rows = {
        entry.label: (entry.name, dict(entry.options)) for entry in load_experiment(study).models
    }
    return rows | EXTRA_VARIANTS


@dataclass(frozen=True)
class RandomTokens(SequenceTask):
    """Uniform random tokens, each position scored against the next token: what a training
    step costs at a length and vocabulary, whatever it learns (not registered)."""

    vocab: int = 64

    @property
    def in_dim(self) -> int:
        return self.vocab

    @property
    def out_dim(self) -> int:
        return self.vocab

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        return torch.randint(0, self.vocab, (n, T), generator=g)

    def answers(self, tokens: Tensor) -> Tensor:
        return tokens.roll(-1, dims=1)


def bench_transformer(
    width: int = 64,
    depth: int = 2,
    length: int = 64,
    batch: int = 32,
    vocab: int = 64,
    steps: int = 3,
    repeats: int = 5,
    threads: int | None = 1,
    device: str = "cpu",
    variants: Mapping[str, tuple[str, dict[str, Any]]] | None = None,
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """Training throughput of each Transformer variant (default:
    `transformer_variants`) relative to the first (the baseline).

    Every variant trains at the same width, depth, batch and sequence length on
    `RandomTokens`: ``steps`` of the trainer's training steps (`TrainingStep`: forward,
    cross-entropy, backward, AdamW) per call, the variants' calls
    interleaved within every repeat and timed as in `bench_operator`;
    ``bf16``: under bfloat16 autocast (CUDA). Returns one row per variant: its model and
    options, parameter count, ms per step, training tokens/s and ``x_transformer``, the
    ratio of its tokens/s to the first variant's, and ``gflop_per_s`` (FLOPs counted on
    one call) beside ``matmul_gflop_per_s``, the matmul rate in the same run
    (`achieved_rates`). Only ratios measured in one call are comparable.
    """
    variants = dict(variants or transformer_variants())
    task = RandomTokens(length=length, vocab=vocab)
    cfg = TrainConfig(batch_size=batch, device=device, bf16=bf16)
    data = to_device(task.sample(batch, 0, "train"), device)
    calls: dict[str, Callable[[], None]] = {}
    params = {}
    for label, (name, options) in variants.items():
        torch.manual_seed(0)
        model = make_model(
            name, in_dim=vocab, out_dim=vocab, width=width, depth=depth, **options
        ).to(device)
        params[label] = count_parameters(model)
        calls[label] = _repeated(TrainingStep(task, cfg, [alone(model)], [data]), steps)
    with timing(threads, device) as (clock, sync):
        measured = achieved_rates(calls, repeats, clock, sync, device)
    first = measured[next(iter(variants))]["seconds"]
    return [
        {
            "variant": label,
            "model": name,
            "options": options,
            "width": width,
            "depth": depth,
            "batch": batch,
            "length": length,
            "params": params[label],
            "ms_per_step": 1e3 * measured[label]["seconds"] / steps,
            "tokens_per_s": batch * length * steps / measured[label]["seconds"],
            "x_transformer": first / measured[label]["seconds"],
            "gflop_per_s": measured[label]["gflop_per_s"],
            "matmul_gflop_per_s": measured[label]["matmul_gflop_per_s"],
        }
        for label, (name, options) in variants.items()
    ]


def _repeated(step: TrainingStep, steps: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(steps):
            step.run()

    return run


def format_transformer_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_transformer` as a plain-text table."""
    lines = [
        f"{'variant':<20} {'params':>10} {'ms/step':>8} {'tokens/s':>9} {'×transformer':>12} "
        f"{'GFLOP/s':>7} {'matmul 256³':>11}"
    ]
    for r in rows:
        lines.append(
            f"{r['variant']:<20} {r['params']:>10,} {r['ms_per_step']:>8.1f} "
            f"{r['tokens_per_s']:>9.0f} {r['x_transformer']:>12.2f} "
            f"{r['gflop_per_s']:>7.1f} {r['matmul_gflop_per_s']:>11.1f}"
        )
    return "\n".join(lines)
