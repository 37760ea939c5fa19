"""``ddl-dyn``: list tasks and models, run an experiment, report and plot a run.

Exit codes: 0 success, 1 some cells failed or diverged, 2 bad usage (unknown names,
invalid values, malformed TOML, missing files, broken task files, a file that is not a
results store, a damaged row or weights file) or a storage problem (disk full, read-only,
permission denied), reported as one line on stderr; warnings go to stderr as one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._task import TASKS, list_tasks
from .analysis.figures import FIGURE_KINDS, make_figures
from .analysis.html import write_html_report
from .analysis.report import RENDERERS, build_report, render, write_report
from .experiment.bench import BENCH_PARTS, bench_output, run_bench
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
    """``task=a,model=b,model=c`` → ``{"task": ["a"], "model": ["b", "c"]}``; a comma that
    starts no ``task=`` or ``model=`` belongs to a label (``task=switched[event=reflect,p=0]``)."""
    if text is None:
        return None
    only: dict[str, list[str]] = {}
    for part in re.split(r",(?=\s*(?:task|model)\s*=)", text):
        axis, sep, label = part.partition("=")
        if not sep or axis.strip() not in ("task", "model") or not label.strip():
            raise ValueError(f"--only: expected task=LABEL or model=LABEL, got {part!r}")
        only.setdefault(axis.strip(), []).append(label.strip())
    return only


def _seeds(text: str | None) -> list[int] | None:
    """``0,1,2`` → ``[0, 1, 2]``; the values are checked with the experiment's seeds."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds: expected integers like 0,1,2, got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    summary = run_experiment(
        args.experiment, run_dir=args.run_dir, jobs=args.jobs, device=args.device,
        seeds=_seeds(args.seeds), only=_only(args.only), backend=args.backend,
        task_files=args.task_file, retry_failed=args.retry == "failed",
        vectorize=args.vectorize, address=args.address,
    )
    report = write_report(summary.run_dir)
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items())
    others = f", {summary.others} by other runs" if summary.others else ""
    print(f"{summary.name}: {counts} ({summary.ran} trained, {summary.skipped} already done"
          f"{others}) in {summary.wall_time:.1f} s")
    print(f"report: {report}")
    return 0 if summary.ok else 1


def _bench(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats: expected at least 1 timed repeat, got {args.repeats}")
    path = bench_output(args.run_dir, args.output)
    results = run_bench(args.parts.split(","), args.experiment,
                        _only(args.only) if args.only else None, _seeds(args.seeds),
                        args.repeats)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"\nbench: {path}")
    return 0


def _load_task_files(args: argparse.Namespace) -> None:
    """``--task-file`` of report and plot: imported before the run's own kept copies, which
    are then only imported for what is still missing."""
    for task_file in args.task_file:
        load_task_file(task_file)


def _report(args: argparse.Namespace) -> int:
    _load_task_files(args)
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
    _task_file_option(run, "a copy is kept in the run folder")
    run.add_argument("--run-dir", help="the run folder (default runs/<name>)")
    run.add_argument("--backend", choices=("local", "ray"), default="local")
    run.add_argument("--address", help="with --backend ray: the cluster to join, e.g. auto "
                                       "or ray://HOST:10001 (default: start a local instance)")
    run.add_argument("--no-vectorize", dest="vectorize", action="store_false",
                     help="train every seed on its own (default: the seeds of a cell train "
                          "together where the model allows)")
    run.add_argument("--retry", choices=("failed",),
                     help="'failed': also train again the cells that diverged or were capped "
                          "(failed cells always run again)")
    run.set_defaults(func=_run)

    bench = sub.add_parser("bench", help="time the operator, training steps and a suite; "
                                         "print tables and write JSON")
    bench.add_argument("--parts", default=",".join(BENCH_PARTS),
                       help=f"comma-separated, of {', '.join(BENCH_PARTS)} (default: all; "
                            "cuda is skipped where CUDA is not available)")
    bench.add_argument("--experiment", default="experiments/regimes.toml",
                       help="the suite to time (default experiments/regimes.toml)")
    bench.add_argument("--only", default="task=overwrite,task=parity",
                       help="the suite's subset (default task=overwrite,task=parity: 39 of "
                            "regimes.toml's 99 cells; '' for all of it)")
    bench.add_argument("--seeds", help="comma-separated seeds, overriding the suite's")
    bench.add_argument("--repeats", type=int, default=20, help="timed repeats per call")
    bench.add_argument("--run-dir", default="runs/bench",
                       help="writes RUN_DIR/bench.json (default runs/bench)")
    bench.add_argument("--output", help="write the JSON here instead")
    bench.set_defaults(func=_bench)

    report = sub.add_parser("report", help="aggregate a run folder into tables")
    report.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    report.add_argument("--format", choices=[*sorted(RENDERERS), "html"], default="md",
                        help="md, csv, json (to stdout) or html (figures embedded, written "
                             "to RUN_DIR/report.html)")
    report.add_argument("--output", help="write to this file instead")
    _task_file_option(report, "instead of the run's kept copy")
    report.set_defaults(func=_report)

    plot = sub.add_parser("plot", help="draw figures of a run folder into RUN_DIR/figures")
    plot.add_argument("kind", choices=[*FIGURE_KINDS, "all"])
    plot.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    _task_file_option(plot, "instead of the run's kept copy")
    plot.set_defaults(func=_plot)
    return parser


def _task_file_option(parser: argparse.ArgumentParser, note: str) -> None:
    parser.add_argument("--task-file", action="append", default=[], metavar="FILE",
                        help=f"a Python file registering tasks (repeatable; {note})")


def _plot(args: argparse.Namespace) -> int:
    _load_task_files(args)
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
        _check_paths(args)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return command(args)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError, ImportError) as err:  # ConfigError is a ValueError
        print(f"ddl-dyn: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddl-dyn: interrupted; finished cells are stored, rerun to resume",
              file=sys.stderr)
        return 130


def _check_paths(args: argparse.Namespace) -> None:
    """An empty folder or file name is a slip, never the current folder (where ``''`` would
    put a run's store)."""
    for name in ("run_dir", "output"):
        if getattr(args, name, None) == "":
            raise ValueError(f"{name}: an empty path (it would be the current folder); give "
                             "a name")


def _one_line(message: object) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _show_warning(message: Warning | str, category: type[Warning], *args: Any,
                  **kwargs: Any) -> None:
    print(f"ddl-dyn: warning: {_one_line(message)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
