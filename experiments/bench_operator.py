"""Benchmark: cost of one Delta update (forward + backward) against a plain residual add.

DESIGN §6 target: within 1.5× of ``X + F`` at d = 256, d_v ∈ {1, 4}, and linear in d
(a materialised d×d operator would be d times more work). Prints measured ratios.

    python experiments/bench_operator.py [--tokens 4096] [--device cpu] [--repeats 50]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import ddl_dynamics as dd


def seconds_per_call(fn: Callable[[], None], repeats: int, device: str) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def make_inputs(tokens: int, d: int, d_v: int, device: str, dtype: torch.dtype):
    shape = (tokens, d) if d_v == 1 else (tokens, d, d_v)
    X = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    F = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    k = dd.normalize_direction(torch.randn(tokens, d, device=device, dtype=dtype))
    k.requires_grad_()
    v = torch.randn((tokens,) if d_v == 1 else (tokens, d_v), device=device, dtype=dtype)
    v.requires_grad_()
    beta = torch.rand(tokens, device=device, dtype=dtype).requires_grad_()
    grad = torch.randn(shape, device=device, dtype=dtype)
    return X, F, k, v, beta, grad


def bench(tokens: int, d: int, d_v: int, device: str, dtype: torch.dtype, repeats: int):
    X, F, k, v, beta, grad = make_inputs(tokens, d, d_v, device, dtype)

    def residual() -> None:
        (X + F).backward(grad)

    def delta() -> None:
        dd.delta_update(X, k, v, beta).backward(grad)

    def dense() -> None:  # the O(d²) alternative the model path avoids
        A = dd.shortcut_matrix(k, beta)
        Xm = X if d_v > 1 else X.unsqueeze(-1)
        vm = v.unsqueeze(-1) if d_v == 1 else v
        (A @ Xm + beta[:, None, None] * k.unsqueeze(-1) * vm.unsqueeze(-2)).backward(
            grad if d_v > 1 else grad.unsqueeze(-1)
        )

    t_add = seconds_per_call(residual, repeats, device)
    t_delta = seconds_per_call(delta, repeats, device)
    t_dense = seconds_per_call(dense, max(3, repeats // 10), device) if d <= 512 else float("nan")
    return t_add, t_delta, t_dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="batch × sequence positions")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"device={args.device} dtype={args.dtype} tokens={args.tokens} "
          f"threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"{'d':>6} {'d_v':>4} {'add ms':>9} {'delta ms':>9} {'delta/add':>10} "
          f"{'dense ms':>9} {'dense/delta':>12}")
    for d_v in (1, 4):
        for d in (64, 256, 1024):
            t_add, t_delta, t_dense = bench(args.tokens, d, d_v, args.device, dtype, args.repeats)
            print(f"{d:>6} {d_v:>4} {1e3 * t_add:>9.3f} {1e3 * t_delta:>9.3f} "
                  f"{t_delta / t_add:>10.2f} {1e3 * t_dense:>9.3f} {t_dense / t_delta:>12.1f}")


if __name__ == "__main__":
    main()
