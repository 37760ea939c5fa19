"""``ddl-dyn bench``: the benchmarks of the parts asked for, each table echoed as it is
measured, every row returned for the JSON."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..experiment.cells import expand_cells
from ..experiment.config import ExperimentConfig
from ..experiment.reader import load_experiment
from .ode import bench_ode, format_ode_table
from .operator import bench_operator, format_operator_table
from .scaling import bench_scaling, format_scaling_table
from .steps import STEP_BASELINE, bench_steps, format_steps_table
from .suite import bench_suite, format_suite_table
from .timing import machine_load
from .transformer import bench_transformer, format_transformer_table, transformer_variants

#: The most timed repeats per call: beyond it a typo would time for days.
MAX_REPEATS = 10_000


def bench_output(run_dir: str | Path, output: str | Path | None) -> Path:
    """Where :func:`run_bench`'s JSON goes (``output``, else ``run_dir/bench.json``), checked
    before anything is timed: ``ValueError`` where a folder on the way is a file."""
    path = Path(output) if output else Path(run_dir) / "bench.json"
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder}: a file, not a folder; give another "
                             f"{'--output' if output else '--run-dir'}")
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a file; give another --output")
    return path


#: The parts of :func:`run_bench`, in the order they run.
BENCH_PARTS = ("operator", "steps", "ode", "scaling", "suite", "cuda")


def run_bench(
    parts: Iterable[str] = BENCH_PARTS,
    experiment: str | Path = "experiments/regimes.toml",
    only: Mapping[str, Sequence[str]] | None = None,
    seeds: Sequence[int] | None = None,
    repeats: int = 20,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmarks in ``parts`` and return what they measured, echoing each table.

    ``operator``: :func:`~.operator.bench_operator`; ``steps``: :func:`~.steps.bench_steps` of
    the vector families and :func:`~.transformer.bench_transformer` of the Transformer
    variants (:func:`~.transformer.transformer_variants`); ``ode``: where a
    neural ODE's step goes (:func:`~.ode.bench_ode`); ``scaling``: a step's time and memory
    against members, width and depth (:func:`~.scaling.bench_scaling`, CPU only); ``suite``:
    :func:`~.suite.bench_suite` of ``experiment`` (restricted to ``only`` and ``seeds``); ``cuda``:
    the same three on CUDA in bfloat16 (autocast for training), or a note that it was
    skipped where CUDA is not available.
    """
    parts = list(parts)
    unknown = sorted(set(parts) - set(BENCH_PARTS))
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCH_PARTS)}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"--repeats: expected 1 to {MAX_REPEATS:,} timed repeats (more would "
                         f"time for days), got {repeats}")
    # the files read are checked before anything is timed: a typo fails at once, not at the end
    cuda_here = "cuda" in parts and torch.cuda.is_available()
    suite: ExperimentConfig | None = None
    if "suite" in parts or cuda_here:
        suite = load_experiment(experiment)
        expand_cells(suite, seeds=seeds, only=only)
    variants = transformer_variants() if "steps" in parts or cuda_here else {}
    results: dict[str, Any] = {"torch": torch.__version__, "threads": 1, "load": machine_load()}
    devices = [("cpu", torch.float32)] if set(parts) - {"cuda"} else []
    if "cuda" in parts:
        if torch.cuda.is_available():
            devices.append(("cuda", torch.bfloat16))
        else:
            results["cuda"] = {"skipped": "CUDA is not available here"}
            echo("cuda: skipped, CUDA is not available here")
    for device, dtype in devices:
        cuda = device == "cuda"
        into = results
        if cuda:
            into = results["cuda"] = {"device": torch.cuda.get_device_name()}
        threads = None if cuda else 1
        if "operator" in parts or cuda:
            echo(f"\n{device}: the Delta update against an add ({dtype})")
            into["operator"] = bench_operator(repeats=repeats, threads=threads, device=device,
                                              dtype=dtype)
            echo(format_operator_table(into["operator"]))
        if "steps" in parts or cuda:
            autocast = " (bf16 autocast)" if cuda else ""
            echo(f"\n{device}: one training step, vector families against "
                 f"{STEP_BASELINE}{autocast}")
            into["steps"] = bench_steps(repeats=repeats, threads=threads, device=device,
                                        bf16=cuda)
            echo(format_steps_table(into["steps"]))
            echo(f"\n{device}: training steps of the Transformer variants{autocast}")
            into["transformer"] = bench_transformer(threads=threads, device=device,
                                                    variants=variants, bf16=cuda)
            echo(format_transformer_table(into["transformer"]))
        if "ode" in parts or cuda:
            echo(f"\n{device}: where a node training step goes")
            into["ode"] = bench_ode(repeats=repeats, threads=threads, device=device)
            echo(format_ode_table(into["ode"]))
        if "scaling" in parts and not cuda:
            echo(f"\n{device}: a training step against members, width and depth, "
                 f"beside {STEP_BASELINE}")
            into["scaling"] = bench_scaling(repeats=max(1, repeats // 4), threads=threads,
                                            device=device)
            echo(format_scaling_table(into["scaling"]))
        if "suite" in parts or cuda:
            subset = f" ({only})" if only else ""
            echo(f"\n{device}: wall time of {experiment}{subset}")
            into["suite_of"] = {"experiment": str(experiment), "only": only, "seeds": seeds}
            into["suite"] = bench_suite(suite or experiment, only, seeds, device=device,
                                        bf16=cuda)
            echo(format_suite_table(into["suite"]))
    results["load_after"] = machine_load()
    return results
