"""A run's progress: one cell bar that says "estimating…" until it can estimate, redrawn on
a terminal, plain lines without escape sequences in a log."""

import io
import re
import sys

from ddl_dynamics.experiment.reader import parse_experiment
from ddl_dynamics.experiment.runner import run_experiment

#: Two groups (one per task) of two seeds, 10 steps each.
TWO_GROUPS = {
    "name": "two-groups",
    "seeds": [0, 1],
    "defaults": {
        "model": {"width": 8, "depth": 2},
        "train": {"steps": 10, "batch_size": 32, "n_train": 64, "n_test": 32, "eval_every": 5},
    },
    "tasks": [{"name": "overwrite"}, {"name": "parity"}],
    "models": [{"name": "resnet"}],
}
REMAINING = re.compile(r"<\d\d:\d\d")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_and_no_step_bar(tmp_path, capsys):
    run_experiment(parse_experiment(TWO_GROUPS), tmp_path / "run")
    err = capsys.readouterr().err
    assert "\x1b[" not in err and "\r" not in err and "step" not in err
    first, *_, last = err.splitlines()
    assert first.startswith("two-groups:") and "0/4" in first and "estimating…" in first
    assert not REMAINING.search(first)
    assert "4/4" in last and REMAINING.search(last)


def test_a_terminal_bar_estimates_only_after_a_group_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", terminal := _Terminal())
    run_experiment(parse_experiment(TWO_GROUPS), tmp_path / "run")
    drawn = [d for d in terminal.getvalue().split("\r") if d.strip()]
    assert "\x1b[" not in terminal.getvalue() and all("step" not in d for d in drawn)
    before = [d for d in drawn if " 0/4 " in d]
    after = [d for d in drawn if " 2/4 " in d or " 4/4 " in d]
    assert before and all("estimating…" in d and not REMAINING.search(d) for d in before)
    assert after and all(REMAINING.search(d) for d in after)
