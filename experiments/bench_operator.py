"""Benchmark: one Delta update (forward + backward) against a residual add and the dense operator.

The target: within 1.5× of ``X + F`` at d = 256, d_v ∈ {1, 4}, and linear in d (a
materialised d×d operator is d times more work). Prints a table of measured ratios and,
with ``--json PATH``, writes the rows of ``ddl_dynamics.bench.operator.bench_operator``
(see its docstring for what is timed and how).

    python experiments/bench_operator.py [--json bench.json] [--repeats 20] [--accumulate]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ddl_dynamics.bench.operator import bench_operator, format_operator_table
from ddl_dynamics.bench.timing import machine_load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the measured rows here")
    parser.add_argument("--dims", default="64,256,1024,4096", help="comma-separated d")
    parser.add_argument("--value-channels", default="1,4", help="comma-separated d_v")
    parser.add_argument("--elements", type=int, default=1 << 20, help="tokens · d")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--accumulate",
        action="store_true",
        help="add gradients into the inputs' .grad instead of returning them",
    )
    args = parser.parse_args()
    config = {
        "dims": [int(d) for d in args.dims.split(",")],
        "value_channels": [int(d) for d in args.value_channels.split(",")],
        "elements": args.elements,
        "repeats": args.repeats,
        "threads": args.threads,
        "device": args.device,
        "dtype": args.dtype,
        "accumulate": args.accumulate,
    }
    print(
        f"torch={torch.__version__} load={machine_load()} "
        + " ".join(f"{key}={value}" for key, value in config.items())
    )
    rows = bench_operator(**{**config, "dtype": getattr(torch, args.dtype)})
    print(format_operator_table(rows))
    print(f"load={machine_load()}")
    if args.json:
        args.json.write_text(json.dumps({"config": config, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
