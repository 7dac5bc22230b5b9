"""The SQLite results store: sweeps, attempts, latest-attempt-wins and bad files."""

from __future__ import annotations

import sqlite3

import pytest

from kbd.plan import spec
from kbd.plan.spec import SweepSpec
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.errors import InputError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "sub" / "results.db")
    yield s
    s.close()


def rec(kernel: str, outcome: str, **fields) -> Record:
    return Record(kernel=kernel, outcome=outcome, phase=fields.pop("phase", "check"), **fields)


def test_create_sweep(store):
    options = spec.encode(SweepSpec(timeout=30, levels=("/x/ci.yaml",)))
    kernels = ["level1/1_A", "level1/2_B"]
    sweep_id = store.create_sweep("run", options, kernels, "abc123")
    sweep = store.sweep(sweep_id)
    assert sweep.id == sweep_id
    assert sweep.status == "running"
    assert sweep.finished is None
    assert sweep.command == "run"
    assert spec.decode(sweep.options, "sweep") == SweepSpec(timeout=30, levels=("/x/ci.yaml",))
    assert sweep.kernels == kernels
    assert sweep.config_hash == "abc123"
    assert sweep.created > 0


def test_set_status(store):
    sweep_id = store.create_sweep("run", "{}", [], "h")
    store.set_status(sweep_id, "done")
    sweep = store.sweep(sweep_id)
    assert sweep.status == "done"
    assert sweep.finished is not None
    assert sweep.finished >= sweep.created
    store.set_status(sweep_id, "running")
    assert store.sweep(sweep_id).finished is None


def test_records_latest_attempt_wins(store):
    first = store.create_sweep("run", "{}", ["a", "b"], "h")
    store.add_attempt(first, "h", rec("a.py", "crash", signal="SIGSEGV", message="boom"))
    store.add_attempt(first, "h", rec("b.py", "pass", wall_s=1.5, passing_tolerance=1e-4))
    store.add_attempt(first, "h", rec("a.py", "pass", times={"jit": 0.25}, limits={"cores": "1"}))
    assert store.records(first) == [
        rec("a.py", "pass", times={"jit": 0.25}, limits={"cores": "1"}),
        rec("b.py", "pass", wall_s=1.5, passing_tolerance=1e-4),
    ]


def test_records_are_per_sweep(store):
    first = store.create_sweep("run", "{}", [], "h")
    second = store.create_sweep("run", "{}", [], "h")
    store.add_attempt(first, "h", rec("a.py", "pass"))
    store.add_attempt(second, "h", rec("a.py", "mismatch"))
    store.add_attempt(second, "h", rec("b.py", "timeout"))
    assert [r.outcome for r in store.records(first)] == ["pass"]
    assert [(r.kernel, r.outcome) for r in store.records(second)] == [
        ("a.py", "mismatch"),
        ("b.py", "timeout"),
    ]
    assert store.records(second + 1) == []


def test_sweep_none_is_latest(store):
    store.create_sweep("run", "{}", ["a"], "h1")
    latest = store.create_sweep("bench", "{}", ["b"], "h2")
    sweep = store.sweep(None)
    assert sweep.id == latest
    assert sweep.command == "bench"
    assert [s.id for s in store.sweeps()] == [latest - 1, latest]


def test_sweep_none_without_sweeps(store):
    with pytest.raises(InputError, match="no sweep recorded yet"):
        store.sweep(None)


def test_unknown_sweep_id(store):
    sweep_id = store.create_sweep("run", "{}", [], "h")
    with pytest.raises(InputError) as info:
        store.sweep(sweep_id + 41)
    assert str(info.value) == f"{store.path}: no sweep with id {sweep_id + 41}"


def test_past_is_latest_of_every_kernel(store):
    first = store.create_sweep("run", "{}", [], "h")
    second = store.create_sweep("run", "{}", [], "h")
    store.add_attempt(first, "h", rec("a.py", "pass", peak_rss_bytes=100))
    store.add_attempt(first, "h", rec("b.py", "crash"))
    store.add_attempt(second, "h", rec("a.py", "memory", peak_rss_bytes=900))
    past = store.past()
    assert set(past) == {("a.py", "import"), ("b.py", "import")}
    assert past["a.py", "import"].outcome == "memory"
    assert past["a.py", "import"].peak_rss_bytes == 900
    assert past["b.py", "import"].outcome == "crash"


def test_attempt_columns(store):
    sweep_id = store.create_sweep("run", "{}", [], "h")
    store.add_attempt(
        sweep_id,
        "cfg",
        rec("a.py", "crash", phase="jit", signal="SIGABRT", message="m", log="/l", wall_s=2.0),
    )
    db = sqlite3.connect(store.path)
    try:
        row = db.execute(
            "SELECT sweep_id, kernel, config_hash, outcome, phase, signal, message, wall_s, log"
            " FROM attempts"
        ).fetchone()
    finally:
        db.close()
    assert row == (sweep_id, "a.py", "cfg", "crash", "jit", "SIGABRT", "m", 2.0, "/l")


def test_reopen_keeps_data(tmp_path):
    path = tmp_path / "results.db"
    first = Store(path)
    sweep_id = first.create_sweep("run", '{"x": 1}', ["a"], "h")
    first.add_attempt(sweep_id, "h", rec("a.py", "pass"))
    first.close()
    second = Store(path)
    try:
        assert second.sweep(None).options == '{"x": 1}'
        assert [r.kernel for r in second.records(sweep_id)] == ["a.py"]
    finally:
        second.close()


def test_wal_mode(store):
    assert store._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()


@pytest.mark.parametrize("content", [b"not a database, just some text\n" * 40, b"hello world"])
def test_not_a_database(tmp_path, content):
    path = tmp_path / "results.db"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        Store(path)
    assert str(info.value).startswith(f"{path}: not a kbd results database")
