"""``ddl-dyn``: list tasks and models, run an experiment, report and plot a run.

Exit codes: 0 success, 1 some cells failed or diverged, 2 bad usage (unknown names,
malformed TOML, missing files), reported as one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ._task import TASKS, list_tasks
from .analysis.figures import FIGURE_KINDS, make_figures
from .analysis.html import write_html_report
from .analysis.report import RENDERERS, build_report, render, write_report
from .experiment.runner import run_experiment
from .experiment.store import load_task_file
from .models.base import MODELS

Command = Callable[[argparse.Namespace], int]


def _tasks(args: argparse.Namespace) -> int:
    list_tasks()
    for name, doc in TASKS.describe():
        print(f"{name:20} {doc}")
    return 0


def _models(args: argparse.Namespace) -> int:
    for name, doc in MODELS.describe():
        print(f"{name:20} {doc}")
    return 0


def _only(text: str | None) -> dict[str, list[str]] | None:
    """``task=a,model=b,model=c`` → ``{"task": ["a"], "model": ["b", "c"]}``."""
    if not text:
        return None
    only: dict[str, list[str]] = {}
    for part in text.split(","):
        axis, sep, label = part.partition("=")
        if not sep or axis.strip() not in ("task", "model") or not label.strip():
            raise ValueError(f"--only: expected task=LABEL or model=LABEL, got {part!r}")
        only.setdefault(axis.strip(), []).append(label.strip())
    return only


def _seeds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds: expected integers like 0,1,2, got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    for task_file in args.task_file:
        load_task_file(task_file)
    summary = run_experiment(
        args.experiment, run_dir=args.run_dir, jobs=args.jobs, device=args.device,
        seeds=_seeds(args.seeds), only=_only(args.only), backend=args.backend,
        task_files=args.task_file,
    )
    report = write_report(summary.run_dir)
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items())
    print(f"{summary.name}: {counts} ({summary.ran} trained, {summary.skipped} already done) "
          f"in {summary.wall_time:.1f} s")
    print(f"report: {report}")
    return 0 if summary.ok else 1


def _report(args: argparse.Namespace) -> int:
    if args.format == "html":  # figures embedded: probes and plots whatever is missing
        print(f"report: {write_html_report(args.run_dir, args.output)}")
        return 0
    text = render(build_report(args.run_dir), args.format)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddl-dyn", description="Deep Delta Learning dynamics benchmark suite.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("tasks", help="list the registered tasks").set_defaults(func=_tasks)
    sub.add_parser("models", help="list the registered models").set_defaults(func=_models)

    run = sub.add_parser("run", help="run an experiment file (resumes a killed run)")
    run.add_argument("experiment", help="the experiment TOML file")
    run.add_argument("--jobs", type=int, default=1, help="cells trained at once (default 1)")
    run.add_argument("--device", choices=("cpu", "cuda"), help="override every cell's device")
    run.add_argument("--seeds", help="comma-separated seeds, overriding the file's")
    run.add_argument("--only", help="restrict to labels, e.g. task=parity,model=ddl")
    run.add_argument("--task-file", action="append", default=[], metavar="FILE",
                     help="a Python file registering tasks (repeatable)")
    run.add_argument("--run-dir", help="the run folder (default runs/<name>)")
    run.add_argument("--backend", choices=("local", "ray"), default="local")
    run.set_defaults(func=_run)

    report = sub.add_parser("report", help="aggregate a run folder into tables")
    report.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    report.add_argument("--format", choices=[*sorted(RENDERERS), "html"], default="md",
                        help="md, csv, json (to stdout) or html (figures embedded, written "
                             "to RUN_DIR/report.html)")
    report.add_argument("--output", help="write to this file instead")
    report.set_defaults(func=_report)

    plot = sub.add_parser("plot", help="draw figures of a run folder into RUN_DIR/figures")
    plot.add_argument("kind", choices=[*FIGURE_KINDS, "all"])
    plot.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    plot.set_defaults(func=_plot)
    return parser


def _plot(args: argparse.Namespace) -> int:
    kinds = FIGURE_KINDS if args.kind == "all" else (args.kind,)
    paths = make_figures(args.run_dir, kinds)
    for path in paths:
        print(path)
    if not paths:
        print(f"ddl-dyn: no figures of kind {args.kind!r}: nothing in {args.run_dir} to draw",
              file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error
        return int(exit_.code or 0)
    command: Command = args.func
    try:
        return command(args)
    except (ValueError, FileNotFoundError, ImportError) as err:  # ConfigError is a ValueError
        print(f"ddl-dyn: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ddl-dyn: interrupted; finished cells are stored, rerun to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
