"""Numerics set once for the whole test run, and fixtures several test files share."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import settings

if not torch.cuda.is_available():  # Triton kernels run in Triton's interpreter, on the CPU;
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
torch.set_num_threads(1)  # small models: threads cost more than they give
torch.use_deterministic_algorithms(True, warn_only=True)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture
def infinite_loss(monkeypatch):
    """``infinite_loss(task)`` makes the task's training loss infinite (evaluation stays
    finite), to exercise the diverged path."""

    def apply(task):
        loss = type(task).loss
        monkeypatch.setattr(
            type(task),
            "loss",
            lambda self, pred, target: (
                loss(self, pred, target) * (math.inf if pred.requires_grad else 1.0)
            ),
        )

    return apply


#: Runs ``ddl-dyn`` command lines (JSON in argv[1]) in one process; prints what each gave.
_COMMANDS = """
import contextlib, io, json, sys
from ddl_dynamics.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append((code, out.getvalue(), err.getvalue()))
sys.stdout.write(json.dumps(results))
"""


@pytest.fixture
def as_user():
    """``as_user(argv, ...)`` runs ``ddl-dyn`` command lines in one fresh process bound by file
    permissions as a user is (as root: without the capabilities that override them), for
    read-only and unreadable files; returns ``(exit code, stdout, stderr)`` per command."""
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
        if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode:
            pytest.skip("root, with no way to drop the capabilities that override permissions")

    def run(*argvs):
        done = subprocess.run(
            [*prefix, sys.executable, "-c", _COMMANDS, json.dumps(argvs)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return [tuple(result) for result in json.loads(done.stdout)]

    return run


#: The smallest study with a declared comparison: 2 tasks × 2 models × 3 seeds, 20 steps.
TINY_STUDY = """
name = "tiny"
description = "a tiny study for the tests: 2 tasks, 2 models, 3 seeds, 20 steps"
seeds = [0, 1, 2]
[defaults.model]
width = 16
depth = 4
[defaults.train]
steps = 20
batch_size = 64
n_train = 256
n_test = 128
eval_every = 10
[[tasks]]
name = "overwrite"
[[tasks]]
name = "parity"
[[models]]
name = "resnet"
[[models]]
name = "ddl"
[[comparisons]]
model = "ddl"
control = "resnet"
question = "Does the delta rule beat the additive stack here?"
"""


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """A run folder of :data:`TINY_STUDY`, trained once per test session (read it only:
    copy it before anything writes into it)."""
    from ddl_dynamics.cli import main

    root = tmp_path_factory.mktemp("tiny")
    (root / "tiny.toml").write_text(TINY_STUDY)
    assert main(["run", str(root / "tiny.toml"), "--run-dir", str(root / "runs" / "tiny")]) == 0
    return root / "runs" / "tiny"


#: The smallest run of the stream-mixing stacks: hc and mhc with 2 streams beside resnet.
MIXING_STUDY = """
name = "mixing"
seeds = [0, 1]
[defaults.model]
width = 8
depth = 3
hidden = 8
[defaults.train]
steps = 10
batch_size = 16
n_train = 64
n_test = 32
eval_every = 5
[[tasks]]
name = "overwrite"
[[models]]
name = "resnet"
[[models]]
name = "hc"
streams = 2
[[models]]
name = "mhc"
streams = 2
"""


@pytest.fixture(scope="session")
def mixing_run(tmp_path_factory):
    """A run folder of :data:`MIXING_STUDY`, trained once per test session (read it only:
    copy it before anything writes into it)."""
    from ddl_dynamics.cli import main

    root = tmp_path_factory.mktemp("mixing")
    (root / "mixing.toml").write_text(MIXING_STUDY)
    assert main(["run", str(root / "mixing.toml"), "--run-dir", str(root / "runs" / "mixing")]) == 0
    return root / "runs" / "mixing"
