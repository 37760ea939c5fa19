"""``ddl-dyn bench``: the benchmarks of the parts asked for, each table echoed as it is
measured, every row returned for the JSON."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..experiment.cells import expand_cells
from ..experiment.config import ExperimentConfig
from ..experiment.reader import load_experiment
from .compiled import bench_compiled, format_compiled_table
from .folded import bench_folded, format_folded_table
from .ode import bench_ode, format_ode_table
from .operator import bench_operator, format_operator_table
from .scaling import bench_scaling, format_scaling_table
from .steps import STEP_BASELINE, bench_steps, format_steps_table
from .studies import bench_studies, format_studies_table
from .suite import bench_suite, format_suite_table
from .timing import machine_load
from .transformer import bench_transformer, format_transformer_table, transformer_variants

#: The most timed repeats per call: beyond it a typo would time for days.
MAX_REPEATS = 10_000


def bench_output(run_dir: str | Path, output: str | Path | None) -> Path:
    """Where `run_bench`'s JSON goes (``output``, else ``run_dir/bench.json``), checked
    before anything is timed: ``ValueError`` where a folder on the way is a file."""
    path = Path(output) if output else Path(run_dir) / "bench.json"
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise ValueError(
                f"{folder}: a file, not a folder; give another "
                f"{'--output' if output else '--run-dir'}"
            )
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a file; give another --output")
    return path


#: The parts of `run_bench`, in the order they run.
BENCH_PARTS = (
    "operator",
    "steps",
    "compile",
    "transformer",
    "ode",
    "scaling",
    "suite",
    "studies",
    "cuda",
)
#: The parts run when none are named: all but ``studies``, which trains for an hour or more.
DEFAULT_PARTS = tuple(p for p in BENCH_PARTS if p != "studies")


def run_bench(
    parts: Iterable[str] = DEFAULT_PARTS,
    experiment: str | Path = "experiments/regimes.toml",
    only: Mapping[str, Sequence[str]] | None = None,
    seeds: Sequence[int] | None = None,
    repeats: int = 20,
    echo: Callable[[str], None] = print,
    results: str | Path = "results",
    studies: Sequence[str] | None = None,
    study_runs: int = 3,
) -> dict[str, Any]:
    """Run the benchmarks in ``parts`` and return what they measured, echoing each table.

    ``operator``: `bench_operator`; ``steps``: `bench_steps` of the vector families and
    `bench_transformer` of the Transformer variants (`transformer_variants`); ``compile``:
    each vector family's folded step, eager against compiled (`bench_compiled`; CPU only);
    ``transformer``: the depth study's folded Transformer step, eager against compiled
    (`bench_folded`; CPU only); ``ode``: where a neural ODE's step goes (`bench_ode`);
    ``scaling``: a step's time and memory against members, width and depth (`bench_scaling`,
    CPU only); ``suite``: `bench_suite` of ``experiment`` (restricted to ``only`` and
    ``seeds``); ``studies``: each study in ``results`` (or those in ``studies``) eagerly and
    at the default compile setting, its longest group cut to ``seeds``, ``study_runs`` times
    each way (`bench_studies`; CPU only); ``cuda``: every part but ``scaling`` on CUDA in
    bfloat16 (autocast for training), or a note that it was skipped where CUDA is not
    available.
    """
    parts = list(parts)
    unknown = sorted(set(parts) - set(BENCH_PARTS))
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCH_PARTS)}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(
            f"--repeats: expected 1 to {MAX_REPEATS:,} timed repeats (more would "
            f"time for days), got {repeats}"
        )
    # the files read are checked before anything is timed: a typo fails at once, not at the end
    cuda_here = "cuda" in parts and torch.cuda.is_available()
    suite: ExperimentConfig | None = None
    if "suite" in parts or cuda_here:
        suite = load_experiment(experiment)
        expand_cells(suite, seeds=seeds, only=only)
    variants = transformer_variants() if "steps" in parts or cuda_here else {}
    measured: dict[str, Any] = {"torch": torch.__version__, "threads": 1, "load": machine_load()}
    devices = [("cpu", torch.float32)] if set(parts) - {"cuda"} else []
    if "cuda" in parts:
        if torch.cuda.is_available():
            devices.append(("cuda", torch.bfloat16))
        else:
            measured["cuda"] = {"skipped": "CUDA is not available here"}
            echo("cuda: skipped, CUDA is not available here")
    plan = _Plan(
        parts, repeats, experiment, only, seeds, suite, variants, echo, results, studies, study_runs
    )
    for device, dtype in devices:
        if device == "cuda":
            measured["cuda"] = {"device": torch.cuda.get_device_name(), **plan.on(device, dtype)}
        else:
            measured |= plan.on(device, dtype)
    measured["load_after"] = machine_load()
    return measured


@dataclass(frozen=True)
class _Plan:
    """What `run_bench` was asked for, its files read and checked."""

    parts: list[str]
    repeats: int
    experiment: str | Path
    only: Mapping[str, Sequence[str]] | None
    seeds: Sequence[int] | None
    suite: ExperimentConfig | None
    variants: dict[str, tuple[str, dict[str, Any]]]
    echo: Callable[[str], None]
    results: str | Path
    studies: Sequence[str] | None
    study_runs: int

    def on(self, device: str, dtype: torch.dtype) -> dict[str, Any]:
        """The parts' rows on ``device``: every part but ``scaling`` on CUDA (bfloat16),
        those asked for on the CPU, on one thread."""
        cuda, echo, repeats = device == "cuda", self.echo, self.repeats
        threads = None if cuda else 1
        into: dict[str, Any] = {}
        if "operator" in self.parts or cuda:
            echo(f"\n{device}: the Delta update against an add ({dtype})")
            into["operator"] = bench_operator(
                repeats=repeats, threads=threads, device=device, dtype=dtype
            )
            echo(format_operator_table(into["operator"]))
        if "steps" in self.parts or cuda:
            autocast = " (bf16 autocast)" if cuda else ""
            echo(
                f"\n{device}: one training step, vector families against {STEP_BASELINE}{autocast}"
            )
            into["steps"] = bench_steps(repeats=repeats, threads=threads, device=device, bf16=cuda)
            echo(format_steps_table(into["steps"]))
            echo(f"\n{device}: training steps of the Transformer variants{autocast}")
            into["transformer"] = bench_transformer(
                threads=threads, device=device, variants=self.variants, bf16=cuda
            )
            echo(format_transformer_table(into["transformer"]))
        if "compile" in self.parts and not cuda:
            echo(f"\n{device}: each vector family's folded step, eager and compiled")
            into["compiled"] = bench_compiled(repeats=max(1, repeats // 2), threads=threads)
            echo(format_compiled_table(into["compiled"]))
        if "transformer" in self.parts and not cuda:
            echo(f"\n{device}: the depth study's folded Transformer step, eager and compiled")
            into["folded"] = bench_folded(
                repeats=max(1, repeats // 2), threads=threads, device=device
            )
            echo(format_folded_table(into["folded"]))
        if "ode" in self.parts or cuda:
            echo(f"\n{device}: where a node training step goes")
            into["ode"] = bench_ode(repeats=repeats, threads=threads, device=device)
            echo(format_ode_table(into["ode"]))
        if "scaling" in self.parts and not cuda:
            echo(
                f"\n{device}: a training step against members, width and depth, "
                f"beside {STEP_BASELINE}"
            )
            into["scaling"] = bench_scaling(
                repeats=max(1, repeats // 4), threads=threads, device=device
            )
            echo(format_scaling_table(into["scaling"]))
        into |= self.trained(device, cuda)
        return into

    def trained(self, device: str, cuda: bool) -> dict[str, Any]:
        """The parts that train whole runs on ``device``: ``suite`` (also on CUDA) and
        ``studies`` (CPU only)."""
        echo = self.echo
        into: dict[str, Any] = {}
        if "suite" in self.parts or cuda:
            subset = f" ({self.only})" if self.only else ""
            echo(f"\n{device}: wall time of {self.experiment}{subset}")
            into["suite_of"] = {
                "experiment": str(self.experiment),
                "only": self.only,
                "seeds": self.seeds,
            }
            into["suite"] = bench_suite(
                self.suite or self.experiment, self.only, self.seeds, device=device, bf16=cuda
            )
            echo(format_suite_table(into["suite"]))
        if "studies" in self.parts and not cuda:
            echo(
                f"\n{device}: each study of {self.results}, its longest group eager and at the "
                f"default, {self.study_runs} run(s) each way, inductor's cache cold (a new empty "
                "folder each run)"
            )
            into["studies"] = bench_studies(self.results, self.seeds, self.studies, self.study_runs)
            echo(format_studies_table(into["studies"]))
        return into
