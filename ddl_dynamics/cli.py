"""``ddl-dyn``: list tasks and models, run an experiment, report and plot a run.

Exit codes: 0 success; 1 some cells failed or diverged (``run``), or nothing to draw
(``plot``); 2 bad usage (unknown names, invalid values, malformed TOML, missing files, broken
task files, a file that is not a results store, a damaged row or weights file) or a storage
problem (disk full, read-only, permission denied), reported as one line on stderr; 3 an
internal error (a bug), reported as one line that says so and names the file holding the
traceback; 130 interrupted. Warnings go to stderr as one line each.

A subcommand's modules (torch, matplotlib) are imported only when it runs, or when its own
``--help`` lists choices that need them: ``ddl-dyn --help`` imports neither. What each
subcommand does is in `ddl_dynamics.commands`; here are its arguments and the exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__
from .commands import bench as _bench
from .commands import compare as _compare
from .commands import docs as _docs
from .commands import load_task_files, plain
from .commands import models as _models
from .commands import plot as _plot
from .commands import publish as _publish
from .commands import report as _report
from .commands import run as _run
from .commands import tasks as _tasks
from .usage import bad_usage, save_traceback

Command = Callable[[argparse.Namespace], int]
#: The exit status after a Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def _tasks_parser(tasks: argparse.ArgumentParser) -> None:
    tasks.add_argument(
        "name", nargs="?", help="a task: print its spec fields, their defaults and what they mean"
    )
    _task_file_option(tasks, "its tasks are listed too")
    tasks.set_defaults(func=_tasks)


def _models_parser(models: argparse.ArgumentParser) -> None:
    models.add_argument(
        "name", nargs="?", help="a model: print its options, their defaults and what they mean"
    )
    _task_file_option(models, "what it registers is listed too")
    models.set_defaults(func=_models)


def _run_parser(run: argparse.ArgumentParser) -> None:
    run.add_argument("experiment", help="the experiment TOML file")
    run.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="cells trained at once, each worker on one torch thread (default 1: "
        "in this process; give the idle cores, e.g. --jobs 2 as the "
        "documented timings do)",
    )
    run.add_argument("--device", choices=("cpu", "cuda"), help="override every cell's device")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a key of the file, e.g. train.steps=300 or "
        "tasks.parity.spec.length=8 (a TOML value; repeatable); checked "
        "like the file and kept in the run's record",
    )
    run.add_argument(
        "--seeds",
        help="how many seeds (the file's first N), or the seeds "
        "themselves, comma-separated (0,1,2)",
    )
    run.add_argument("--only", help="restrict to labels, e.g. task=parity,model=ddl")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="list the cells and groups that would train (grid, seeds, members folded "
        "per group), estimate their training time here, and exit without training",
    )
    _task_file_option(run, "a copy is kept in the run folder")
    run.add_argument("--run-dir", help="the run folder (default runs/<name>)")
    run.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local: worker processes on this machine (default); ray: the cells "
        "as Ray tasks, on a local instance or the cluster of --address",
    )
    run.add_argument(
        "--address",
        help="with --backend ray: the cluster to join, e.g. auto "
        "or ray://HOST:10001 (default: start a local instance)",
    )
    run.add_argument(
        "--no-vectorize",
        dest="vectorize",
        action="store_false",
        help="train every seed on its own (default: the seeds of a cell train "
        "together where the model allows)",
    )
    run.add_argument(
        "--retry",
        choices=("failed",),
        help="'failed': also train again the cells that diverged or were capped "
        "(failed cells always run again)",
    )
    run.set_defaults(func=_run)


def _bench_parser(bench: argparse.ArgumentParser) -> None:
    from .bench.run import BENCH_PARTS, DEFAULT_PARTS

    bench.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated, of {', '.join(BENCH_PARTS)} (default: all but studies, "
        "which trains for an hour or more; cuda is skipped where CUDA is not available)",
    )
    bench.add_argument(
        "--experiment",
        default="experiments/regimes.toml",
        help="the suite to time (default experiments/regimes.toml)",
    )
    bench.add_argument(
        "--only",
        default="task=overwrite,task=parity",
        help="the suite's subset (default task=overwrite,task=parity: 39 of "
        "regimes.toml's 99 cells; '' for all of it)",
    )
    bench.add_argument(
        "--seeds", help="comma-separated seeds, overriding the suite's and the studies'"
    )
    bench.add_argument("--results", default="results", help="the studies' folder (default results)")
    bench.add_argument("--studies", help="comma-separated studies of --results (default: all)")
    bench.add_argument("--repeats", type=int, default=20, help="timed repeats per call")
    bench.add_argument(
        "--study-runs",
        type=int,
        default=3,
        help="studies: runs each way, the order alternating, the fastest kept (default 3)",
    )
    bench.add_argument(
        "--run-dir", default="runs/bench", help="writes RUN_DIR/bench.json (default runs/bench)"
    )
    bench.add_argument("--output", help="write the JSON here instead")
    bench.set_defaults(func=_bench)


def _report_parser(report: argparse.ArgumentParser) -> None:
    from .analysis.render.formats import RENDERERS

    report.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    report.add_argument(
        "--format",
        choices=[*sorted(RENDERERS), "html"],
        default="md",
        help="md, json (to stdout), csv (one line per cell: task, model, "
        "seed, grid values, status, each metric a column) or html "
        "(figures embedded, written to RUN_DIR/report.html)",
    )
    report.add_argument("--output", help="write to this file instead")
    _task_file_option(report, "instead of the run's kept copy")
    report.add_argument(
        "--no-task-files",
        dest="task_files",
        action="store_false",
        help="import none of the task files the run folder keeps (a run "
        "folder holds Python that report, plot, compare and publish "
        "otherwise import: read only folders you trust); its tasks "
        "must be built in or given with --task-file",
    )
    report.set_defaults(func=_report)


def _plot_parser(plot: argparse.ArgumentParser) -> None:
    from .analysis.figures import FIGURE_HELP, FIGURE_KINDS

    plot.formatter_class = argparse.RawDescriptionHelpFormatter
    kinds = {**FIGURE_HELP, "all": "every kind above"}
    plot.epilog = "figure kinds:\n" + "\n".join(
        f"  {k:13} {plain(text)}" for k, text in kinds.items()
    )
    plot.add_argument("kind", choices=[*FIGURE_KINDS, "all"], help="the figures to draw (below)")
    plot.add_argument("run_dir", help="the run folder, e.g. runs/quick")
    _task_file_option(plot, "instead of the run's kept copy")
    plot.set_defaults(func=_plot)


def _task_file_option(parser: argparse.ArgumentParser, note: str) -> None:
    parser.add_argument(
        "--task-file",
        action="append",
        default=[],
        metavar="FILE",
        help=f"a Python file registering tasks (repeatable; {note})",
    )


# --- published results: publish a run, regenerate the docs from them, check a rerun


def _publish_parser(publish: argparse.ArgumentParser) -> None:
    publish.add_argument("run_dir", help="the run folder, e.g. runs/regimes")
    publish.add_argument("--name", help="the study's name (default: the experiment's)")
    publish.add_argument(
        "--results", default="results", help="the results folder (default results)"
    )
    publish.add_argument(
        "--command", help="what ran it, for run.json (default: ddl-dyn run experiments/NAME.toml)"
    )
    publish.add_argument(
        "--allow-partial",
        action="store_true",
        help="publish a run that did not end, lacks cells or finished none "
        "(refused otherwise); run.json and the page say what it lacks",
    )
    publish.set_defaults(func=_publish)


def _docs_parser(docs: argparse.ArgumentParser) -> None:
    docs.add_argument("--results", default="results", help="the results folder (default results)")
    docs.add_argument("--out", default=".", help="the repository root to write (default .)")
    docs.set_defaults(func=_docs)


def _compare_parser(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("run", help="the rerun: a run folder or a published study")
    compare.add_argument("reference", help="the reference, e.g. results/regimes")
    compare.set_defaults(func=_compare)


def _completion_parser(completion: argparse.ArgumentParser) -> None:
    from .completion import SHELLS

    completion.add_argument(
        "shell",
        choices=SHELLS,
        help="the shell to write for: save the script once and load it "
        "from your shell's startup file (see Getting started)",
    )
    _task_file_option(completion, "its task and model names are completed too")
    completion.set_defaults(func=_completion)


def _completion(args: argparse.Namespace) -> int:
    from ._task import list_tasks
    from .completion import script
    from .models.base import list_models

    load_task_files(args)
    names = {"tasks": list_tasks(), "models": list_models()}
    print(script(_parser(every=True), args.shell, "ddl-dyn", names), end="")
    return 0


#: The subcommands: name → (help, the function that adds its arguments). Only the one asked
#: for is built, so that the others' imports are never made.
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "tasks": ("list the registered tasks, or one task's spec fields", _tasks_parser),
    "models": ("list the registered models, or one model's options", _models_parser),
    "run": ("run an experiment file (resumes a killed run)", _run_parser),
    "bench": (
        "time the operator, training steps and a suite; print tables and write JSON",
        _bench_parser,
    ),
    "report": ("aggregate a run folder into tables", _report_parser),
    "plot": ("draw figures of a run folder into RUN_DIR/figures", _plot_parser),
    "publish": (
        "write a run's reference results to results/NAME (report JSON, figures, config)",
        _publish_parser,
    ),
    "docs": ("regenerate the README headline and the study pages from results/", _docs_parser),
    "compare": (
        "check a rerun against a published reference: how its config differs, then "
        "each comparison both ran (exit 1 where one differs)",
        _compare_parser,
    ),
    "completion": (
        "print a completion script for bash or zsh (subcommands, options, their "
        "choices, task and model names)",
        _completion_parser,
    ),
}


def _parser(argv: Sequence[str] = (), every: bool = False) -> argparse.ArgumentParser:
    """The command line's parser, with the arguments of the subcommand ``argv`` names (its
    first word that is not an option), or of ``every`` one (for a completion script)."""
    parser = argparse.ArgumentParser(
        prog="ddl-dyn", description="Deep Delta Learning dynamics benchmark suite."
    )
    parser.add_argument("--version", action="version", version=f"ddl-dyn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((word for word in argv if not word.startswith("-")), None)
    for name, (text, build) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=text, description=text)
        if every or name == chosen:
            build(command)
    return parser


def script() -> NoReturn:
    """The ``ddl-dyn`` command: exit with `main`'s status. After a Ctrl-C, at once, its
    output flushed: the interpreter's teardown takes seconds of CPU with torch loaded (far
    longer on a busy machine), a wait for a run that has already stopped."""
    code = main()
    if code == INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to keep
                stream.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error, the help or version
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
    except KeyboardInterrupt:
        print("ddl-dyn: interrupted; finished cells are stored, rerun to resume", file=sys.stderr)
        return INTERRUPTED
    except Exception as err:
        if bad_usage(err):
            print(f"ddl-dyn: error: {_one_line(err)}", file=sys.stderr)
            return 2
        print(
            f"ddl-dyn: internal error (a bug, not your input): {type(err).__name__}: "
            f"{_one_line(err)}; traceback in {save_traceback(err)}",
            file=sys.stderr,
        )
        return 3


def _check_paths(args: argparse.Namespace) -> None:
    """An empty folder or file name is a slip, never the current folder (where ``''`` would
    put a run's store)."""
    for name in ("run_dir", "output"):
        if getattr(args, name, None) == "":
            raise ValueError(f"{name}: an empty path (it would be the current folder); give a name")


def _one_line(message: object) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _show_warning(
    message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
) -> None:
    print(f"ddl-dyn: warning: {_one_line(message)}", file=sys.stderr)


if __name__ == "__main__":
    script()
