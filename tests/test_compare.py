"""``ddl-dyn compare``: a rerun checked against a published reference, comparison by
comparison."""

import json
import shutil
import sqlite3

from ddl_dynamics.cli import main


def _published(tiny_study, tmp_path):
    assert main(["publish", str(tiny_study), "--results", str(tmp_path / "results")]) == 0
    return tmp_path / "results" / "tiny"


def test_a_run_reproduces_its_own_reference(tiny_study, tmp_path, capsys):
    reference = _published(tiny_study, tmp_path)
    capsys.readouterr()
    assert main(["compare", str(tiny_study), str(reference)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    comparisons = json.loads((reference / "report.json").read_text())["comparisons"]
    assert len(lines) == len(comparisons) + 1
    assert all(line.endswith(": reproduced") for line in lines[:-1])
    assert lines[-1] == f"{len(comparisons)} of {len(comparisons)} comparisons reproduced"


def test_a_changed_row_is_named(tiny_study, tmp_path, capsys):
    reference = _published(tiny_study, tmp_path)
    rerun = tmp_path / "rerun"
    shutil.copytree(tiny_study, rerun)
    with sqlite3.connect(rerun / "results.sqlite") as con:  # ddl on parity: every seed right
        for key, metrics in con.execute(
            "SELECT key, metrics FROM results WHERE task = 'parity' AND model = 'ddl'"
        ).fetchall():
            con.execute(
                "UPDATE results SET metrics = ? WHERE key = ?",
                (json.dumps({**json.loads(metrics), "test": 1.0}), key),
            )
    capsys.readouterr()
    assert main(["compare", str(rerun), str(reference)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert [line for line in out[:-1] if "DIFFERS" in line] == [
        line for line in out[:-1] if line.startswith("parity: ddl − resnet")
    ]
    assert "DIFFERS" in next(line for line in out if line.startswith("parity: ddl − resnet"))
    assert out[-1].endswith("differ: ddl − resnet on parity")
    assert "overwrite: ddl − resnet" in out[0] and out[0].endswith("reproduced")


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "missing"), str(tmp_path)]) == 2
    assert "neither a run folder" in capsys.readouterr().err


def test_a_shrunk_rerun_says_how_its_config_differs_and_compares_what_both_ran(
    tiny_study, tmp_path, capsys
):
    reference = _published(tiny_study, tmp_path)
    rerun = tmp_path / "shrunk"
    assert (
        main(
            [
                "run",
                str(tiny_study.parent.parent / "tiny.toml"),
                "--run-dir",
                str(rerun),
                "--seeds",
                "2",
                "--set",
                "train.steps=10",
                "--only",
                "task=parity",
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(["compare", str(rerun), str(reference)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[:4] == [
        "config: the rerun differs from the reference in 3 keys:",
        "  defaults.train.steps 20 → 10",
        "  only — → task=parity",
        "  seeds [0, 1, 2] → [0, 1]",
    ]
    assert "may differ by design" in out[4]
    (overwrite,) = [line for line in out if line.startswith("overwrite: ddl − resnet")]
    assert overwrite.endswith("rerun —: not run")
    (parity,) = [line for line in out if line.startswith("parity: ddl − resnet")]
    reproduced = parity.endswith(": reproduced")
    assert out[-1].startswith(f"{int(reproduced)} of 1 comparisons reproduced; 1 not run")
    assert code == (0 if reproduced else 1)


def test_the_only_restriction_is_spelled_as_the_option_is():
    from ddl_dynamics.experiment.options import RunOptions, recorded
    from ddl_dynamics.publish.reproduce import config_changes

    text = 'name = "x"\nseeds = [0, 1]\n'
    only = {"task": ["switched[event=reflect,p=0]"], "model": ["ddl", "hc"]}
    rerun = recorded(text, RunOptions(only=only))
    assert config_changes({"experiment": {"config": text}}, {"experiment": {"config": rerun}}) == [
        "only — → task=switched[event=reflect,p=0],model=ddl,model=hc"
    ]
