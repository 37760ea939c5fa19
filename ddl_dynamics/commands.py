"""What each ``ddl-dyn`` subcommand does with its parsed arguments, returning its exit status.

Kept apart from `ddl_dynamics.cli`, which builds the parser and turns errors into exit codes, so
that each reads as one idea. A command imports its modules (torch, matplotlib) only when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._registry import Registry


def _listed(registry: Registry[Any]) -> int:
    """Every entry of a registry, one line each: its name and first docstring line."""
    for name, doc in registry.describe():
        print(f"{name:20} {doc}")
    return 0


def tasks(args: argparse.Namespace) -> int:
    from ._registry import first_paragraph
    from ._task import TASKS, make_task

    load_task_files(args)
    if args.name is None:
        return _listed(TASKS)
    cls, task = TASKS.get(args.name), make_task(args.name)
    print(f"{args.name}: {plain(first_paragraph(cls))}")
    print(
        f"kind {task.kind}; metric {task.metric_name} "
        f"({'higher' if task.higher_is_better else 'lower'} is better); "
        f"splits {', '.join(task.splits)}" + (f"; knob {task.knob}" if task.knob else "")
    )
    if task.regime:
        print(f"probes: {task.regime}")
    _print_options(
        "spec fields (an experiment file sets them in its [[tasks]] entry's spec)",
        [(f.name, f.type, getattr(task, f.name)) for f in dataclasses.fields(task)],
        cls,
    )
    return 0


def models(args: argparse.Namespace) -> int:
    from ._registry import first_paragraph
    from .models.base import MODELS, model_options

    load_task_files(args)
    if args.name is None:
        return _listed(MODELS)
    factory = MODELS.get(args.name)
    print(f"{args.name}: {plain(first_paragraph(factory))}")
    options = model_options(args.name)
    _print_options(
        "options (an experiment file sets them in its [[models]] entry)",
        [(name, hint, default) for name, (default, hint) in options.items()],
        factory,
    )
    return 0


def plain(text: str) -> str:
    """Docstring text without its reST markup: ````x```` and ``:role:`x``` read ``x``."""
    return re.sub(r":\w+:`~?([^`]*)`", r"\1", text).replace("``", "")


def _print_options(title: str, options: Sequence[tuple[str, Any, Any]], owner: object) -> None:
    """One line per option: its name, type and default, then what its documentation says."""
    from ._registry import option_docs

    docs = option_docs(owner)
    print(f"{title}:")
    for name, hint, default in options:
        kind = hint if isinstance(hint, str) else getattr(hint, "__name__", str(hint or ""))
        said = f"  {plain(docs[name])}" if name in docs else ""
        print(f"  {name} ({kind}) = {default!r}{said}")


def _seeds(text: str | None) -> list[int] | None:
    """``0,1,2`` → ``[0, 1, 2]``; the values are checked with the experiment's seeds."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds: expected integers like 0,1,2, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from .analysis.render.formats import write_report
    from .bench.estimate import estimate_lines
    from .experiment.compiling import cache_folder
    from .experiment.folder import load_task_file
    from .experiment.options import RunOptions, parse_only, parse_seeds
    from .experiment.reader import load_experiment
    from .experiment.runner import plan, run_experiment

    options = RunOptions(
        tuple(args.set),
        None if args.seeds is None else parse_seeds(args.seeds),
        {} if args.only is None else parse_only(args.only),
    )
    for task_file in args.task_file:  # before the experiment names their tasks
        load_task_file(task_file)
    config = load_experiment(args.experiment, options)
    if args.dry_run:
        estimate = functools.partial(estimate_lines, jobs=args.jobs)
        print(
            "\n".join(
                plan(
                    config,
                    args.run_dir,
                    args.device,
                    options.only,
                    args.vectorize,
                    estimate,
                    args.jobs,
                )
            )
        )
        return 0
    summary = run_experiment(
        config,
        run_dir=args.run_dir,
        jobs=args.jobs,
        device=args.device,
        only=options.only or None,
        backend=args.backend,
        task_files=args.task_file,
        retry_failed=args.retry == "failed",
        vectorize=args.vectorize,
        address=args.address,
    )
    report = write_report(summary.run_dir)
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items())
    others = f", {summary.others} by other runs" if summary.others else ""
    print(
        f"{summary.name}: {counts} ({summary.ran} trained, {summary.skipped} already done"
        f"{others}) in {summary.wall_time:.1f} s"
    )
    if summary.ran:
        print(
            f"compiled: {len(summary.compiles)} group{'' if len(summary.compiles) == 1 else 's'}, "
            f"{sum(summary.compiles):.1f} s compiling "
            f"(inductor's cache: {cache_folder()})"
        )
    print(f"report: {report}")
    return 0 if summary.ok else 1


def bench(args: argparse.Namespace) -> int:
    from .bench.run import bench_output, run_bench
    from .experiment.options import parse_only

    if args.repeats < 1:
        raise ValueError(f"--repeats: expected at least 1 timed repeat, got {args.repeats}")
    if args.study_runs < 1:
        raise ValueError(f"--study-runs: expected at least 1 run each way, got {args.study_runs}")
    path = bench_output(args.run_dir, args.output)
    results = run_bench(
        args.parts.split(","),
        args.experiment,
        parse_only(args.only) if args.only else None,
        _seeds(args.seeds),
        args.repeats,
        results=args.results,
        studies=args.studies.split(",") if args.studies else None,
        study_runs=args.study_runs,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"\nbench: {path}")
    return 0


def load_task_files(args: argparse.Namespace) -> None:
    """``--task-file`` of the listings, report and plot: imported before a run's own kept
    copies, which are then only imported for what is still missing."""
    from .experiment.folder import load_task_file

    for task_file in args.task_file:
        load_task_file(task_file)


def report(args: argparse.Namespace) -> int:
    from .analysis.render.formats import render
    from .analysis.render.html import write_html_report
    from .analysis.report.build import build_report
    from .experiment.folder import RunFolder

    load_task_files(args)
    run = RunFolder.open(args.run_dir, task_files=args.task_files)
    if args.format == "html":  # figures embedded: probes and plots whatever is missing
        print(f"report: {write_html_report(run, args.output)}")
        return 0
    text = render(build_report(run), args.format)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text)
    return 0


def plot(args: argparse.Namespace) -> int:
    from .analysis.figures import FIGURE_KINDS, make_figures

    load_task_files(args)
    kinds = FIGURE_KINDS if args.kind == "all" else (args.kind,)
    paths = make_figures(args.run_dir, kinds)
    for path in paths:
        print(path)
    if not paths:
        print(
            f"ddl-dyn: no figures of kind {args.kind!r}: nothing in {args.run_dir} to draw",
            file=sys.stderr,
        )
    for kind, reason in paths.skipped.items():
        print(f"ddl-dyn: nothing to draw for {kind}: {reason}", file=sys.stderr)
    return 0 if paths else 1


def publish(args: argparse.Namespace) -> int:
    from .publish.publish import publish as publish_run

    out = publish_run(args.run_dir, args.results, args.name, args.command, args.allow_partial)
    print(f"published: {out}")
    return 0


def docs(args: argparse.Namespace) -> int:
    from .publish.pages import write_docs

    written, removed = write_docs(args.results, args.out)
    for path in written:
        print(path)
    for path in removed:
        print(f"removed (generated before, no longer): {path}")
    return 0


def compare(args: argparse.Namespace) -> int:
    from .publish.reproduce import check

    comparison = check(args.run, args.reference)
    print("\n".join(comparison.lines()))
    return 0 if comparison.passed else 1
