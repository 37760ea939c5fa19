"""Benchmark: training tokens/s of the Transformer variants relative to ``transformer``, and the
folded training step of the Transformer studies against an earlier revision of the model.

The target of the suite: d_v = 1 at ≥ 0.95× and d_v = 4 (CC) at ≥ 0.85× of the additive
baseline at the same width; the paper reports 0.88× and 0.77× on an H200. Prints one table
per width, every ratio measured within one call (see
``ddl_dynamics.bench.transformer.bench_transformer`` for what is timed and how), with each
step's achieved GFLOP/s beside the machine's rate on a 256³ matmul timed in the same run.

``--folded``: the trainer's step (forward, each member's loss, backward, per-member AdamW)
of ``--members`` members folded at the studies' sizes (the block of
``experiments/transformer.toml``; depth 2 on var-chain hops = 2, T = 6; depth 4 on hops = 4,
T = 10, the depth study's; it folds 16 members, 8 seeds × 2 rates) for its rows ``ROWS``, on
this tree's models and on the models of ``--against`` (a git revision, read with ``git
show`` into a private module, never registered; default 89a60bc, the revision the Transformer's cost
was first measured on), the two interleaved in one process (``achieved_rates``). With
``--compile``, this tree's step runs compiled (``TrainConfig.compile``) and the revision's
eagerly, as it then ran. With ``--json PATH``, writes the rows.

    python experiments/bench_transformer.py [--widths 64,256] [--length 64] [--batch 32]
    python experiments/bench_transformer.py --folded [--compile] [--against 89a60bc]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ddl_dynamics import make_task
from ddl_dynamics.bench.steps import TrainingStep
from ddl_dynamics.bench.timing import achieved_rates, machine_load, timing
from ddl_dynamics.bench.transformer import (
    STUDY,
    bench_transformer,
    format_transformer_table,
    transformer_variants,
)
from ddl_dynamics.experiment.batches import fold_data
from ddl_dynamics.experiment.config import TrainConfig
from ddl_dynamics.experiment.reader import load_experiment
from ddl_dynamics.experiment.step import member_losses, predictor
from ddl_dynamics.models import base, ensemble, transformer

ROOT = Path(__file__).resolve().parents[1]
#: (depth, var-chain hops) of the studies: 2 blocks at hops = 2 (T = 6), 4 at hops = 4 (T = 10).
SIZES = ((2, 2), (4, 4))
#: The study's rows timed folded: the baseline and the Delta block at d_v = 1 and 4.
ROWS = ("transformer", "ddl-dv1", "ddl-dv4")


def study_rows() -> tuple[dict[str, Any], dict[str, tuple[str, dict[str, Any]]]]:
    """The block options the study's rows share (its model defaults but the depth and the
    parameter matching, which the sizes here set), and each of :data:`ROWS` as (model
    class name, options)."""
    defaults = load_experiment(STUDY).model_defaults
    block = {k: v for k, v in defaults.items() if k not in ("depth", "match_params")}
    variants = transformer_variants()
    return block, {
        label: (base.MODELS.get(variants[label][0]).__name__, variants[label][1]) for label in ROWS
    }


def revision_models(rev: str) -> tuple[ModuleType, ModuleType]:
    """The model and ensemble modules of git revision ``rev``, loaded under private names (its
    ``register_model`` calls do nothing, so the registry keeps this tree's families)."""
    modules = []
    for name in ("transformer", "ensemble"):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:ddl_dynamics/models/{name}.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        private = f"ddl_dynamics.models._{name}_at_{rev}"
        source = source.replace("from .transformer import", f"from ._transformer_at_{rev} import")
        spec = importlib.util.spec_from_loader(private, loader=None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[private] = module
        register, base.register_model = base.register_model, lambda _: lambda cls: cls
        try:
            exec(compile(source, f"{rev}:{name}.py", "exec"), module.__dict__)
        finally:
            base.register_model = register
        modules.append(module)
    return modules[0], modules[1]


def folded_step(
    models: ModuleType,
    folding: ModuleType,
    cls: str,
    options: dict[str, Any],
    block: dict[str, Any],
    depth: int,
    hops: int,
    members: int,
    batch: int = 32,
    compile: bool = False,
) -> tuple[Callable[[], None], torch.Tensor]:
    """The trainer's step of ``members`` seeds of ``cls`` folded (compiled with
    ``compile``), and the members' losses before it."""
    task = make_task("var-chain", hops=hops)
    built = []
    for seed in range(members):
        torch.manual_seed(seed)
        built.append(
            getattr(models, cls)(
                in_dim=task.in_dim, out_dim=task.out_dim, depth=depth, **block, **options
            )
        )
    folded = folding.fold(built)
    assert folded is not None and folded.size == members, "the models must fold"
    data = fold_data([task.sample(batch, seed, "train") for seed in range(members)])
    step = TrainingStep(
        task, TrainConfig(batch_size=batch, lr=1e-3, compile=compile), [folded], [data]
    )
    with torch.no_grad():
        first = member_losses(folded.module, task, data, predictor(task, bf16=False), members)
    return step.run, first


def bench_folded(
    against: str, repeats: int, members: int = 16, compile: bool = False
) -> list[dict[str, Any]]:
    """Each row's folded step on this tree (compiled with ``compile``) and on ``against``
    (eager), interleaved, once their losses on the same weights and batches are found equal
    to float32 rounding; with its FLOPs and achieved rate beside the matmul rate
    (:func:`achieved_rates`), counted on an eager call."""
    old_models, old_folding = revision_models(against)
    block, rows_of = study_rows()
    rows = []
    with timing(1, "cpu") as (clock, sync):
        for depth, hops in SIZES:
            calls, losses = {}, {}
            for label, (cls, options) in rows_of.items():
                for tree, models, folding in (
                    ("new", transformer, ensemble),
                    ("old", old_models, old_folding),
                ):
                    calls[label, tree], losses[tree] = folded_step(
                        models,
                        folding,
                        cls,
                        options,
                        block,
                        depth,
                        hops,
                        members,
                        compile=compile and tree == "new",
                    )
                torch.testing.assert_close(losses["new"], losses["old"], rtol=1e-5, atol=1e-6)
            measured = achieved_rates(calls, repeats, clock, sync, "cpu", warmup=2)
            for label in rows_of:
                new, old = measured[label, "new"], measured[label, "old"]
                rows.append(
                    {
                        "row": label,
                        "depth": depth,
                        "hops": hops,
                        "members": members,
                        "compiled": compile,
                        "old_ms": 1e3 * old["seconds"],
                        "new_ms": 1e3 * new["seconds"],
                        "x_old": old["seconds"] / new["seconds"],
                        "gflop": new["flops"] / 1e9,
                        "gflop_per_s": new["gflop_per_s"],
                        "matmul_gflop_per_s": new["matmul_gflop_per_s"],
                    }
                )
    return rows


def format_folded_table(rows: list[dict[str, Any]], against: str) -> str:
    lines = [
        f"{'row':<12} {'depth':>5} {'hops':>4} {against + ' ms':>12} {'now ms':>8} "
        f"{'speed-up':>8} {'GFLOP':>6} {'GFLOP/s':>7} {'of matmul':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['row']:<12} {r['depth']:>5} {r['hops']:>4} {r['old_ms']:>12.1f} "
            f"{r['new_ms']:>8.1f} {r['x_old']:>8.2f} {r['gflop']:>6.2f} "
            f"{r['gflop_per_s']:>7.1f} {r['gflop_per_s'] / r['matmul_gflop_per_s']:>9.0%}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the measured rows here")
    parser.add_argument("--widths", default="64,256", help="comma-separated widths")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--folded", action="store_true", help="the studies' folded step, against --against, instead"
    )
    parser.add_argument(
        "--against", default="89a60bc", help="git revision whose models --folded compares with"
    )
    parser.add_argument("--members", type=int, default=16, help="--folded: members folded")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="--folded: this tree's step compiled (the revision's eager)",
    )
    args = parser.parse_args()
    print(f"torch={torch.__version__} load={machine_load()}")
    if args.folded:
        rows = bench_folded(args.against, args.repeats, args.members, args.compile)
        now = "compiled" if args.compile else "eager"
        print(
            f"folded step, {args.members} members, this tree {now}, {args.against} eager, "
            f"one thread, matmul 256³: "
            f"{rows[0]['matmul_gflop_per_s']:.0f} GFLOP/s\n"
            f"{format_folded_table(rows, args.against)}"
        )
    else:
        print(
            f"depth={args.depth} batch={args.batch} length={args.length} "
            f"threads={args.threads} device={args.device}"
        )
        rows = []
        for width in (int(w) for w in args.widths.split(",")):
            found = bench_transformer(
                width=width,
                depth=args.depth,
                length=args.length,
                batch=args.batch,
                steps=args.steps,
                repeats=args.repeats,
                threads=args.threads,
                device=args.device,
            )
            print(f"\nwidth {width}\n{format_transformer_table(found)}")
            rows += found
    print(f"load={machine_load()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
