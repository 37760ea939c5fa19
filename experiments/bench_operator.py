"""Benchmark: cost of one Delta update (forward + backward) against a plain residual add.

The target: within 1.5× of ``X + F`` at d = 256, d_v ∈ {1, 4}, and linear in d
(a materialised d×d operator would be d times more work). Prints measured ratios:
the library's ``delta_update`` and ``write_update``, the same delta rule as unfused torch
ops under autograd, and the dense ``A X`` alternative; then the cost per state element
across d at a fixed state size, which stays flat when the update is linear in d.

The calls being compared are interleaved within each repeat, so load from other processes
falls on all of them alike; on a shared machine ``--threads 1`` gives the steadiest ratios.

    python experiments/bench_operator.py [--tokens 4096] [--repeats 50] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
from torch import Tensor

import ddl_dynamics as dd


def unfused_delta(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """The delta rule as plain torch ops, differentiated op by op by autograd."""
    acc = torch.promote_types(X.dtype, torch.float32)
    readout = torch.einsum("...d,...dv->...v", k.to(acc), X.to(acc))
    coef = beta.to(acc).unsqueeze(-1) * (v.to(acc) - readout)
    return torch.addcmul(X, k.unsqueeze(-1), coef.to(X.dtype).unsqueeze(-2))


def dense_delta(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """The O(d²) alternative the model path avoids: ``A X + β k vᵀ`` with a materialised A."""
    return dd.shortcut_matrix(k, beta) @ X + beta[:, None, None] * k.unsqueeze(-1) * v.unsqueeze(-2)


def median_ms(
    fns: dict[str, Callable[[], None]], repeats: int, device: str, warmup: int = 3
) -> dict[str, float]:
    """Median wall time in ms of each call, the calls interleaved within every repeat."""

    def once(fn: Callable[[], None]) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(once(fn))
    return {name: 1e3 * sorted(t)[len(t) // 2] for name, t in times.items()}


def fwd_bwd_calls(
    tokens: int, d: int, d_v: int, device: str, dtype: torch.dtype
) -> dict[str, Callable[[], None]]:
    """One forward + backward of each update on a state ``(tokens, d, d_v)``, the model layout."""

    def leaf(*shape: int) -> Tensor:
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=True)

    X, F = leaf(tokens, d, d_v), leaf(tokens, d, d_v)
    k = dd.normalize_direction(torch.randn(tokens, d, device=device, dtype=dtype)).requires_grad_()
    v, beta = leaf(tokens, d_v), torch.rand(tokens, device=device, dtype=dtype).requires_grad_()
    grad = torch.randn(X.shape, device=device, dtype=dtype)
    updates = {
        "delta": dd.delta_update,
        "unfused": unfused_delta,
        "write": dd.write_update,
        "dense": dense_delta,
    }
    calls = {"add": lambda: (X + F).backward(grad)}
    for name, update in updates.items():
        calls[name] = lambda update=update: update(X, k, v, beta).backward(grad)
    return calls


def load() -> str:
    """The 1, 5 and 15 minute load averages: other processes share the cores being timed."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="batch × sequence positions")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"device={args.device} dtype={args.dtype} tokens={args.tokens} threads={args.threads} "
          f"repeats={args.repeats} torch={torch.__version__} load={load()}")

    compared = ("add", "delta", "unfused", "write")
    print("\nforward + backward: median ms, and × the add")
    print(f"{'d':>6} {'d_v':>4} {'add':>8}" + "".join(f" {n:>8} {'×':>6}" for n in compared[1:])
          + f" {'dense×delta':>12}")
    for d_v in (1, 4):
        for d in (64, 256, 1024):
            calls = fwd_bwd_calls(args.tokens, d, d_v, args.device, dtype)
            ms = median_ms({n: calls[n] for n in compared}, args.repeats, args.device)
            row = f"{d:>6} {d_v:>4} {ms['add']:>8.3f}"
            row += "".join(f" {ms[n]:>8.3f} {ms[n] / ms['add']:>6.2f}" for n in compared[1:])
            if d <= 256:  # d times more work: a single call gives the order of magnitude
                dense = median_ms({"dense": calls["dense"]}, 1, args.device, warmup=0)["dense"]
                row += f" {dense / ms['delta']:>12.0f}"
            print(row)

    elements = 2**20
    print(f"\nlinear in d: tokens·d = {elements} per value channel; ns per state element")
    print(f"{'d':>6} {'d_v':>4} {'tokens':>7} {'add':>7} {'delta':>7} {'×':>6}")
    for d_v in (1, 4):
        for d in (64, 256, 1024, 4096):
            calls = fwd_bwd_calls(elements // d, d, d_v, args.device, dtype)
            ms = median_ms({n: calls[n] for n in ("add", "delta")}, args.repeats, args.device)
            ns = {n: 1e6 * t / (elements * d_v) for n, t in ms.items()}
            print(f"{d:>6} {d_v:>4} {elements // d:>7} {ns['add']:>7.2f} {ns['delta']:>7.2f} "
                  f"{ms['delta'] / ms['add']:>6.2f}")
    print(f"\nload={load()}")


if __name__ == "__main__":
    main()
