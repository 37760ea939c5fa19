"""Benchmark: training tokens/s of the Transformer variants relative to ``transformer``.

The target of the suite: d_v = 1 at ≥ 0.95× and d_v = 4 (CC) at ≥ 0.85× of the additive
baseline at the same width; the paper reports 0.88× and 0.77× on an H200. Prints one table
per width, every ratio measured within one call (see
``ddl_dynamics.experiment.bench.bench_transformer`` for what is timed and how); with
``--json PATH``, writes the rows.

    python experiments/bench_transformer.py [--widths 64,256] [--length 64] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ddl_dynamics.experiment.bench import bench_transformer, format_transformer_table, machine_load


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
    args = parser.parse_args()
    print(f"torch={torch.__version__} load={machine_load()} depth={args.depth} "
          f"batch={args.batch} length={args.length} threads={args.threads} device={args.device}")
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        found = bench_transformer(width=width, depth=args.depth, length=args.length,
                                  batch=args.batch, steps=args.steps, repeats=args.repeats,
                                  threads=args.threads, device=args.device)
        print(f"\nwidth {width}\n{format_transformer_table(found)}")
        rows += found
    print(f"load={machine_load()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
