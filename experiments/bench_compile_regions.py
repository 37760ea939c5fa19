"""Benchmark: what compiling a Transformer group costs and saves, three ways.

A group of ``experiments/transformer-depth.toml`` at 2 seeds (6 members: 2 seeds × 3 rates)
is its own architecture and shape, so a compile it starts is paid by its 360 steps alone.
This times, per row and hop count (``--seeds``, of the study's 8, set the members), the
folded training step eagerly and compiled three ways, each in a process of its own with
inductor's cache in a new empty folder:

- ``whole``: the forward and losses as one graph (what ``train.compile`` does);
- ``blocks``: each Transformer block compiled on its own (``nn.Module.compile``), so the
  blocks of a row share one graph and each graph is a quarter of the model;
- ``blocks-dynamic``: the same with dynamic shapes, so that hop counts (sequence lengths)
  share their graphs.

Prints, for each, the first call's wall seconds (its compile and one step) and
the median of 15 later steps, on one thread; the hop counts run in one process in order.

    python experiments/bench_compile_regions.py [--rows transformer,ddl-dv4] [--hops 1,2,3,4]
        [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

WAYS = ("eager", "whole", "blocks", "blocks-dynamic")


def measure(way: str, row: str, hops: list[int], seeds: list[int]) -> None:
    """Print the first call and median step of ``row`` compiled ``way``, hop count by hop
    count, in this process (its inductor cache set by the caller)."""
    import torch

    from ddl_dynamics.bench.folded import DEPTH_STUDY, study_cells, study_step

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools")  # RoPE's cache
    for hop in hops:
        label = f"var-chain-w32[hops={hop}]"
        cells = [c for c in study_cells(DEPTH_STUDY, label, row) if c.seed in seeds]
        step = study_step(cells, compile=way == "whole")
        if way.startswith("blocks"):
            for block in step.groups[0].module.blocks:
                block.compile(dynamic=way == "blocks-dynamic")
        start = time.perf_counter()
        step.run()
        first = time.perf_counter() - start
        times = []
        for _ in range(15):
            start = time.perf_counter()
            step.run()
            times.append(time.perf_counter() - start)
        print(
            f"{way:14} {row:12} hops {hop}: {len(cells)} members, first call {first:6.2f} s, "
            f"step {1000 * statistics.median(times):6.1f} ms",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="transformer,ddl-dv4")
    parser.add_argument("--hops", default="1,2,3,4")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one child's part
    args = parser.parse_args()
    hops = [int(h) for h in args.hops.split(",")]
    if args.way:
        for row in args.rows.split(","):
            measure(args.way, row, hops, [int(s) for s in args.seeds.split(",")])
        return
    for row in args.rows.split(","):
        for way in WAYS:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                command = [sys.argv[0], "--way", way, "--rows", row, "--hops", args.hops]
                command += ["--seeds", args.seeds]
                subprocess.run([sys.executable, *command], env=env, check=True)


if __name__ == "__main__":
    main()
