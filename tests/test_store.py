"""The results store: roundtrip, WAL mode, concurrent writers, run metadata, claims, its
schema version, and files that are not a store."""

import dataclasses
import math
import sqlite3
import threading

import pytest

import ddl_dynamics as dd
from ddl_dynamics.experiment.provenance import Progress
from ddl_dynamics.experiment.store import SCHEMA_VERSION, ResultStore


def result(key, status="ok", task="parity", model="ddl", seed=0, test=0.5):
    return dd.RunResult(
        status=status,
        message=f"msg {key}",
        key=key,
        task=task,
        model=model,
        seed=seed,
        metrics={"metric": "mse", "test": test, "ood": {"long": None}, "extra": {"e": 1.5}},
        curve=[[10, 0.3, 0.4, 1e6]],
        params=123,
        flops=456.0,
        nfe_forward=12.5,
        nfe_backward=0.0,
        wall_time=1.25,
        peak_mem=2**20,
        config={"seed": seed, "x": [1, 2]},
    )


def test_put_get_roundtrip_and_queries(tmp_path):
    store = ResultStore(tmp_path / "results.sqlite")
    original = result("a", test=float("nan"))
    store.put(original)
    got = store.get("a")
    assert math.isnan(got.metrics.pop("test"))
    original.metrics.pop("test")
    assert {**got.__dict__, "created_at": ""} == original.__dict__
    assert got.created_at
    store.put(result("b", status="failed", model="resnet"))
    store.put(result("c", status="diverged", seed=1))
    store.put(result("d", status="capped", task="overwrite"))
    keys = ["a", "b", "c", "d", "new"]
    assert set(store.todo(keys)) == {"b", "new"}  # failed cells are not finished: they rerun
    assert set(store.todo(keys, finished=("ok",))) == {"b", "c", "d", "new"}  # --retry failed
    assert [r.key for r in store.rows(task="parity", model="ddl")] == ["a", "c"]
    assert store.get("missing") is None
    store.put(result("b", status="ok", model="resnet"))  # a rerun replaces the row
    assert store.get("b").status == "ok" and len(store.rows()) == 4


def test_wal_mode_and_concurrent_writers(tmp_path):
    path = tmp_path / "results.sqlite"
    ResultStore(path)
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def write(worker):
        store = ResultStore(path)
        for i in range(20):
            store.put(result(f"{worker}-{i}", seed=i))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ResultStore(path).rows()) == 80


def test_a_store_created_while_another_connection_writes_waits_for_it(tmp_path):
    """SQLite refuses the switch to WAL mode at once, without waiting, while another
    connection holds the write lock: two runs creating one store at once met this."""
    path = tmp_path / "results.sqlite"
    locked, release = threading.Event(), threading.Event()

    def writer():
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")  # the write lock, on a file still in rollback mode
        locked.set()
        release.wait(30)
        con.execute("COMMIT")
        con.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert locked.wait(30)
    threading.Timer(0.3, release.set).start()
    try:
        ResultStore(path).put(result("after-the-lock"))
    finally:
        release.set()
        thread.join()
    assert [row.key for row in ResultStore(path).rows()] == ["after-the-lock"]
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_run_metadata(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    assert store.experiment() is None
    record = {
        "file": "/x/tasks.py",
        "sha256": "ab",
        "copy": "task_files/tasks-ab.py",
        "registers": ["task:x"],
    }
    run_id = store.start_run("quick", 'name = "quick"', [record])
    meta = store.experiment()
    assert meta["name"] == "quick" and meta["config"] == 'name = "quick"'
    assert meta["task_files"] == [record] and meta["ended_at"] is None
    assert {"python", "torch", "torchdiffeq", "numpy"} <= set(meta["versions"])
    assert meta["machine"]["cpu_count"] >= 1
    store.finish_run(run_id)
    assert store.experiment()["ended_at"] >= meta["started_at"]


def test_a_killed_run_spans_to_its_last_stored_result(tmp_path):
    """A run that never ended (killed) counts to the last result it stored before the
    resume began; one that stored none has no end; a finished run ends where it said."""
    store = ResultStore(tmp_path / "r.sqlite")
    store.start_run("quick", 'name = "quick"')
    store.put(result("a"))
    store.put(result("b"))
    stored = max(store.get(k).created_at for k in "ab")
    resumed = store.start_run("quick", 'name = "quick"')
    store.put(result("c"))
    store.finish_run(resumed)
    (first_start, first_end), (second_start, second_end) = store.spans()
    assert first_end == stored and first_start <= first_end < second_start <= second_end
    store.start_run("quick", 'name = "quick"')  # killed before it stored anything
    assert store.spans()[-1][1] is None


def test_progress_of_the_latest_run(tmp_path):
    """What a run selected is recorded with it, so a report can say how far it got."""
    path = tmp_path / "results.sqlite"
    store = ResultStore(path)
    assert store.progress() is None  # no run started yet
    run_id = store.start_run("quick", 'name = "quick"', cells=["a", "b", "c"])
    store.put(result("a"))
    store.put(result("b", status="failed"))  # a failure is a result too
    store.put(result("elsewhere"))  # not selected by this run
    assert store.progress() == Progress(2, 3, ended=False)
    assert str(store.progress()) == "2 of 3 cells; run unfinished"
    store.finish_run(run_id)
    assert str(ResultStore(path, create=False).progress()) == "2 of 3 cells"


@pytest.mark.parametrize("found", ["before versions", "a later version"])
def test_a_store_of_another_schema_version_is_refused_and_left_alone(tmp_path, found):
    """A store is read only under the schema it was written with: one from before stores
    carried a version (its runs table without the cells each run selected, say), or one
    from a later version, is refused, naming its version, and never written into."""
    path = tmp_path / "results.sqlite"
    if found == "before versions":
        with sqlite3.connect(path) as con:
            con.executescript(dd.experiment.schema.SCHEMA.replace(",\n    cells TEXT", ""))
        version = 0
    else:
        ResultStore(path).put(result("a"))
        version = SCHEMA_VERSION + 1
        with sqlite3.connect(path) as con:
            con.execute(f"PRAGMA user_version = {version}")
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    for create in (True, False):
        with pytest.raises(
            ValueError,
            match=f"a results store of schema version {version}; "
            f"this version of ddl_dynamics reads version {SCHEMA_VERSION} alone",
        ):
            ResultStore(path, create=create)
    assert path.read_bytes() == before


def test_an_unversioned_store_of_version_1s_tables_is_read_as_version_1(tmp_path):
    """The 0.x releases wrote version 1's tables without the version: their runs stay
    readable, and a store that differs in any table is not."""
    path = tmp_path / "results.sqlite"
    ResultStore(path).put(result("a"))
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA user_version = 0")
    assert [r.key for r in ResultStore(path, create=False).rows()] == ["a"]
    ResultStore(path).put(result("b"))
    with sqlite3.connect(path) as con:
        con.execute("ALTER TABLE results ADD COLUMN extra TEXT")
    with pytest.raises(ValueError, match="schema version 0"):
        ResultStore(path, create=False)


def test_a_new_store_carries_the_schema_version(tmp_path):
    ResultStore(tmp_path / "results.sqlite")
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1


def test_claims_split_cells_between_owners(tmp_path):
    store = ResultStore(tmp_path / "results.sqlite")
    assert store.todo(["k"]) == {"k": 0}
    assert store.claim("k", "a", 0, stale_after=60) == "claimed"
    assert store.claim("k", "b", 0, stale_after=60) == "busy"  # a is alive
    assert store.claim("k", "a", 0, stale_after=60) == "claimed"  # claiming again is fine
    assert store.owners() == {"a"}
    store.put(result("k"))  # a's result ends the claim and advances the generation
    assert store.owners() == set() and store.todo(["k"]) == {}
    assert store.claim("k", "b", 0, stale_after=60) == "done"  # b saw it unfinished: now done
    assert store.todo(["k"], finished=("failed",)) == {"k": 1}
    assert store.claim("k", "b", 1, stale_after=60) == "claimed"


def test_stale_and_released_claims_are_taken_over(tmp_path):
    store = ResultStore(tmp_path / "results.sqlite")
    assert store.claim("k", "a", 0, stale_after=60) == "claimed"
    assert store.claim("k", "b", 0, stale_after=-1) == "claimed"  # a's heartbeat is too old
    assert store.claim("k", "a", 0, stale_after=60) == "busy"
    store.heartbeat("b")
    store.release("b", ["other"])
    assert store.owners() == {"b"}
    store.release("b")
    assert store.owners() == set() and store.claim("k", "a", 0, stale_after=60) == "claimed"


def test_claims_are_taken_in_one_transaction(tmp_path):
    """Eight threads race for the same 20 cells: each cell is claimed exactly once."""
    path = tmp_path / "results.sqlite"
    ResultStore(path)
    won: dict[str, list[str]] = {}

    def race(owner):
        store = ResultStore(path)
        won[owner] = [
            k for k in map(str, range(20)) if store.claim(k, owner, 0, stale_after=60) == "claimed"
        ]

    threads = [threading.Thread(target=race, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = sorted(k for keys in won.values() for k in keys)
    assert claimed == sorted(map(str, range(20)))


@pytest.mark.parametrize("content", ["truncated", "garbage", "unrelated", "empty"])
def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path, content):
    path = tmp_path / "results.sqlite"
    if content == "unrelated":
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE notes (text TEXT)")
    elif content == "truncated":
        store = ResultStore(path)
        for i in range(50):
            store.put(result(str(i), seed=i))
        with sqlite3.connect(path) as con:  # fold the WAL in, then cut the file short
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        path.write_bytes(path.read_bytes()[:6000])
    else:
        path.write_bytes(b"" if content == "empty" else b"not sqlite at all " * 100)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="not a results store"):
        ResultStore(path, create=False).rows()
    if content != "empty":  # an empty file is a new store to a run
        with pytest.raises(ValueError, match="not a results store"):
            ResultStore(path).rows()
    assert path.read_bytes() == before  # never written into


def test_a_run_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(ValueError, match="a file, not a run folder"):
        ResultStore(tmp_path / "run" / "results.sqlite")
    with pytest.raises(FileNotFoundError, match="no results store"):
        ResultStore(tmp_path / "results.sqlite", create=False)


def test_a_result_written_again_keeps_the_one_it_replaces_as_an_attempt(tmp_path):
    store = ResultStore(tmp_path / "results.sqlite")
    first = dd.RunResult(
        status="diverged",
        message="loss became nan",
        key="k",
        task="t",
        model="m",
        seed=3,
        metrics={"test": None},
    )
    store.put(first)
    assert store.attempts() == []
    store.put(dataclasses.replace(first, status="ok", message="", metrics={"test": 0.5}))
    store.put(dataclasses.replace(first, status="ok", message="", metrics={"test": 0.25}))
    assert [r.status for r in store.rows()] == ["ok"]
    assert store.rows()[0].metrics == {"test": 0.25}
    history = store.attempts()
    assert [(r.status, r.message, r.metrics) for r in history] == [
        ("diverged", "loss became nan", {"test": None}),
        ("ok", "", {"test": 0.5}),
    ]
    assert all((r.key, r.seed) == ("k", 3) and r.created_at for r in history)
    # read-only opening sees the history too
    assert ResultStore(tmp_path / "results.sqlite", create=False).attempts() == history
