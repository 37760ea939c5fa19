"""Which errors are the user's and which are bugs: ``ddl-dyn`` exits 2 on bad input or a
storage problem and 3 on an internal error, and this module decides which, by the error's
type (`bad_usage`), and keeps a bug's traceback (`save_traceback`)."""

from __future__ import annotations

import sys
import sysconfig
import tempfile
import traceback
from pathlib import Path

#: The package whose own error kinds are bad input.
PACKAGE = __name__.rpartition(".")[0]
#: The suite's typed errors that are not a ``ValueError`` yet say what the input asked for,
#: by module and name: a cap the run's config set (``max_seconds``, ``ode_max_steps``).
CAPS = (("experiment.caps", "Capped"), ("models.dopri5", "SolverCapped"))


def bad_usage(err: Exception) -> bool:
    """Whether ``err`` is a user's mistake or a storage problem, not a bug, by its type: an
    ``OSError`` (a file missing, unreadable or full); one of the suite's own ``ValueError``
    kinds (`ConfigError`, `TaskCheckError`, `TaskDataError`, `DamagedError`, …); a cap
    the config set (`CAPS`). A plain ``ValueError`` or ``ImportError`` counts where the
    suite's code or a user's task file raised it itself (`_raised_here`); from inside a
    library (torch, numpy, the standard library), from a built-in operation (an unpacking,
    a conversion) and of every other type, an error is a bug."""
    if isinstance(err, OSError):
        return True
    if isinstance(err, ValueError) and type(err).__module__.startswith(PACKAGE + "."):
        return True
    caps = tuple(
        getattr(sys.modules[f"{PACKAGE}.{module}"], name)
        for module, name in CAPS
        if f"{PACKAGE}.{module}" in sys.modules
    )
    if isinstance(err, caps):
        return True
    return isinstance(err, ValueError | ImportError) and _raised_here(err)


def _raised_here(err: BaseException) -> bool:
    """Whether ``err`` left a ``raise`` statement (the instruction its innermost frame
    stopped at raises, whatever the source line reads) of the suite's code or of a file
    outside the installed libraries (a user's task file)."""
    import dis

    frames = err.__traceback__
    if frames is None:
        return False
    while frames.tb_next is not None:
        frames = frames.tb_next
    code = frames.tb_frame.f_code
    if dis.opname[code.co_code[frames.tb_lasti]] != "RAISE_VARARGS":
        return False
    where = Path(code.co_filename).resolve()
    libraries = {
        sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    return where.is_relative_to(Path(__file__).resolve().parent) or not any(
        where.is_relative_to(Path(path).resolve()) for path in libraries if path
    )


def save_traceback(err: BaseException) -> str:
    """Where the traceback of ``err`` went: a new temporary file, else stderr."""
    text = "".join(traceback.format_exception(err))
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix="ddl-dyn-traceback-", suffix=".txt", delete=False
        ) as file:
            file.write(text)
        return file.name
    except OSError:
        print(text, file=sys.stderr, end="")
        return "the lines above"
