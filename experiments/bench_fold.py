"""Benchmark: a row's seeds trained end to end one by one, and folded into one ensemble.

What folding buys a study: each seed of a row (``overwrite``, width 32, depth 8, 1,200
steps, eval every 100) trained as its own cell, one after another, against the same seeds
trained together as the trainer folds them, on one thread, in turns (one by one, folded,
one by one, ...), wall clock, sampling, evaluation and checks included. Prints each
family's median wall times, the median of the paired ratios (folded over one by one) and
the largest difference between a seed's test metric trained the two ways (float rounding
of the batched matmuls, amplified by training).

    python experiments/bench_fold.py [--families resnet,ddl] [--seeds 4] [--steps 1200] [--pairs 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import ddl_dynamics as dd
from ddl_dynamics.bench.timing import machine_load
from ddl_dynamics.experiment.config import Cell
from ddl_dynamics.experiment.train import run_cells


def cells(family: str, seeds: int, steps: int) -> list[Cell]:
    """The cells of ``family``'s row: ``seeds`` seeds at one learning rate."""
    config = dd.parse_experiment(
        {
            "name": "fold",
            "seeds": list(range(seeds)),
            "tasks": [{"name": "overwrite"}],
            "models": [{"name": family}],
            "defaults": {
                "model": {"width": 32, "depth": 8, "hidden": 32},
                "train": {
                    "steps": steps,
                    "batch_size": 128,
                    "n_train": 4096,
                    "n_test": 1024,
                    "eval_every": 100,
                    "compile": False,
                },
                "tune": {"lr": [3e-3]},
            },
        }
    )
    return dd.expand_cells(config)


def scores_of(cells: list[Cell]) -> list[float]:
    """Train ``cells`` (together where they fold); each cell's test metric."""
    return [trained.result.metrics["test"] for trained in run_cells(cells)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="resnet,ddl")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load {machine_load()}; {args.seeds} seeds, {args.steps} steps, wall s")
    for family in args.families.split(","):
        row = cells(family, args.seeds, args.steps)
        run_cells(row[:1])  # warm: imports, kernels, allocator
        alone, folded, ratios, differences = [], [], [], []
        for _ in range(args.pairs):
            start = time.perf_counter()
            one_by_one = [metric for cell in row for metric in scores_of([cell])]
            alone.append(time.perf_counter() - start)
            start = time.perf_counter()
            together = scores_of(row)
            folded.append(time.perf_counter() - start)
            ratios.append(folded[-1] / alone[-1])
            differences += [abs(a - b) for a, b in zip(one_by_one, together, strict=True)]
        print(
            f"{family:8} one by one {statistics.median(alone):6.2f}, "
            f"folded {statistics.median(folded):6.2f}: ×{statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}–{max(ratios):.3f} over {args.pairs} pairs); "
            f"test metric differs by ≤ {max(differences):.2g}"
        )


if __name__ == "__main__":
    main()
