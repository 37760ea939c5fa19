"""Benchmark: several seeds' training steps one by one, under ``torch.func.vmap``, and folded.

Why seeds train together as a folded ensemble (``ddl_dynamics.models.ensemble.fold``) and
not under ``vmap(functional_call(...))``: this times one training step (forward, each
member's loss, backward, per-member clipping, AdamW) of S seeds all three ways, on one
thread, by the thread's CPU time (medians of interleaved repeats).

    python experiments/bench_seeds.py [--families resnet,ddl] [--seeds 1,3,5]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

import ddl_dynamics as dd
from ddl_dynamics.bench.steps import TrainingStep
from ddl_dynamics.bench.timing import machine_load, median_times
from ddl_dynamics.experiment.batches import fold_data
from ddl_dynamics.models.ensemble import Ensemble, alone, fold


class VmapEnsemble(nn.Module):
    """The members under ``vmap`` over ``functional_call``, called like one of them on a
    batch concatenated member by member."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        params, self.buffers_ = stack_module_state(models)
        self.names = list(params)
        self.stacked = nn.ParameterList(params.values())
        self.base = (copy.deepcopy(models[0]).to("meta"),)  # a tuple: not a submodule
        self.size = len(models)

    def forward(self, x: Tensor, u: Tensor | None = None, **kwargs: object) -> Tensor:
        def one(params: dict[str, Tensor], x: Tensor, u: Tensor | None) -> Tensor:
            return functional_call(self.base[0], (params, self.buffers_), (x,), {"u": u, **kwargs})

        params = dict(zip(self.names, self.stacked, strict=True))
        xs = x.unflatten(0, (self.size, -1))
        us = None if u is None else u.unflatten(0, (self.size, -1))
        return vmap(one, in_dims=(0, 0, None if u is None else 0))(params, xs, us).flatten(0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="resnet,ddl")
    parser.add_argument("--seeds", default="1,3,5")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = dd.make_task("overwrite")
    cfg = dd.TrainConfig()
    print(f"load {machine_load()}; CPU ms per step of all seeds (× one by one)")
    for family in args.families.split(","):
        for size in map(int, args.seeds.split(",")):

            def models(family: str = family, size: int = size) -> list[nn.Module]:
                built = []
                for seed in range(size):
                    torch.manual_seed(seed)
                    built.append(
                        dd.make_model(
                            family,
                            in_dim=task.in_dim,
                            out_dim=task.out_dim,
                            control_dim=task.control_dim,
                        )
                    )
                return built

            parts = [task.sample(128, seed, "train") for seed in range(size)]
            vmapped = VmapEnsemble(models())
            one_by_one = [alone(m) for m in models()]
            ways = {
                "one by one": TrainingStep(task, cfg, one_by_one, parts),
                "vmap": TrainingStep(
                    task,
                    cfg,
                    [Ensemble(vmapped, models(), [(p, []) for p in vmapped.stacked])],
                    [fold_data(parts)],
                ),
                "folded": TrainingStep(task, cfg, [fold(models())], [fold_data(parts)]),
            }
            calls = {name: step.run for name, step in ways.items()}
            times = median_times(calls, args.repeats, time.thread_time, lambda: None)
            alone_ms = 1e3 * times["one by one"]
            print(
                f"{family:8} S={size}: "
                + ", ".join(
                    f"{name} {1e3 * t:5.1f} ({1e3 * t / alone_ms:.2f}×)"
                    for name, t in times.items()
                )
            )


if __name__ == "__main__":
    main()
