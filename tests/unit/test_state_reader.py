"""The state DB's fast reader (engine/state/reader.py, #24 item 9 and leftover b): it
reads what StateDB reads, falls back to StateDB where it cannot, and waits a bounded
time for another process's lock on a DB in rollback-journal mode."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time

import pytest

from jobctl.engine.state import reader
from jobctl.engine.state.db import StateDB, runs
from jobctl.engine.state.leases import JobEvents
from jobctl.engine.state.leases import timeline as full_timeline
from jobctl.engine.state.reader import (
    READ_WAIT_S,
    WRITE_WAIT_S,
    StateDBError,
    StateReader,
    read_state,
    write_wait_s,
)


def _seeded(home, monkeypatch) -> StateDB:
    monkeypatch.delenv("JOBCTL_DB_URL", raising=False)
    ticks = iter(range(1000, 2000))
    db = StateDB(home, clock=lambda: float(next(ticks)))
    for rid, name in (("a-1", "a"), ("a-2", "a"), ("b-1", "b")):
        db.create_run(rid, name, home / "runs" / rid, total_steps=9)
        db.set_phase(rid, "launching")
        db.update_run(rid, step=3, loss=1.5, samples_per_s=2.0, pids="1,2")
    db.add_event("a-2", "stop", "asked", {"by": "test"})
    JobEvents(db, "scheduler").add("a", "trigger", "fired", now=1500.5)
    return db


def test_the_reader_knows_every_column_of_runs():
    assert set(reader.RUN_COLUMNS) == {c.name for c in runs.columns}


def test_the_reader_reads_what_state_db_reads(tmp_path, monkeypatch):
    db = _seeded(tmp_path, monkeypatch)
    fast = read_state(tmp_path)
    assert isinstance(fast, StateReader)
    assert fast.list_runs() == db.list_runs() and len(fast.list_runs()) == 3
    for ref in ("a-1", "a", "b", "nope"):
        assert fast.get_run(ref) == db.get_run(ref)
    assert fast.get_run("a")["id"] == "a-2"  # the newest of that name
    assert fast.events("a-2") == db.events("a-2")
    assert fast.events("a-2", limit=2) == db.events("a-2", limit=2)
    assert len(fast.events("a-2", limit=2)) == 2
    got = reader.timeline(fast, "a")
    assert got == full_timeline(db, "a")
    assert {r["source"] for r in got} == {"a-1", "a-2", "scheduler"}


def test_nonsense_values_read_as_none_as_state_db_reads_them(tmp_path, monkeypatch):
    db = _seeded(tmp_path, monkeypatch)
    con = sqlite3.connect(tmp_path / "state.db")
    con.execute("UPDATE runs SET step = 'abc', loss = 'x', total_steps = '[/x]', name = 7")
    con.commit()
    con.close()
    row = read_state(tmp_path).get_run("a-1")
    assert (row["step"], row["loss"], row["total_steps"], row["name"]) == (None, None, None, "7")
    assert row == db.get_run("a-1")


def test_other_databases_and_older_ones_go_through_state_db(tmp_path, monkeypatch):
    monkeypatch.delenv("JOBCTL_DB_URL", raising=False)
    assert isinstance(read_state(tmp_path / "new"), StateDB)  # no file yet: created
    old = tmp_path / "old"
    old.mkdir()
    con = sqlite3.connect(old / "state.db")
    con.execute(
        "CREATE TABLE runs (id VARCHAR(128) PRIMARY KEY, name VARCHAR(64), "
        "phase VARCHAR(32), run_dir TEXT, created_at FLOAT, updated_at FLOAT)"
    )
    con.execute(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id VARCHAR(128), "
        "ts FLOAT, kind VARCHAR(32), message TEXT, data TEXT)"
    )
    con.execute("INSERT INTO runs VALUES ('o-1', 'o', 'completed', '/x', 1.0, 2.0)")
    con.commit()
    con.close()
    db = read_state(old)
    assert isinstance(db, StateDB)  # which adds the columns an older jobctl lacked
    assert db.get_run("o-1")["supervisor_pid"] is None
    assert isinstance(read_state(old), StateReader)
    monkeypatch.setenv("JOBCTL_DB_URL", f"sqlite:///{old / 'state.db'}")
    assert read_state(tmp_path / "elsewhere").get_run("o")["id"] == "o-1"
    assert reader._sqlite_path("postgresql://h/db") is None
    assert reader._sqlite_path("sqlite:///rel.db?timeout=3") is None


def _locked(home):
    """A connection holding an exclusive lock on home's DB (in rollback mode)."""
    holder = sqlite3.connect(home / "state.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE runs SET step = 5")
    return holder


def test_a_reader_waits_a_bounded_time_for_an_exclusive_lock(tmp_path, monkeypatch):
    """Leftover (b): it waited the writers' 10 s; now READ_WAIT_S, then one clear line."""
    db = _seeded(tmp_path, monkeypatch)
    db.engine.dispose()
    con = sqlite3.connect(tmp_path / "state.db")
    con.execute("PRAGMA journal_mode=DELETE")  # as a file system without WAL leaves it
    con.close()
    fast = read_state(tmp_path)
    holder = _locked(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(StateDBError, match=r"locked .*waited 2 s.*retry when it is done"):
            fast.list_runs()
        assert time.monotonic() - start < READ_WAIT_S + 4.0  # not the writers' 10 s
        env = {**os.environ, "JOBCTL_HOME": str(tmp_path)}
        done = subprocess.run(
            ["jobctl", "status"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "retry" in done.stderr and str(tmp_path / "state.db") in done.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["step"] for r in fast.list_runs()] == [3, 3, 3]  # and reads once it is free


def test_a_write_that_gives_up_on_a_lock_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    """`jobctl stop --home H` against a DB another process keeps write-locked for
    longer than the writers' busy wait (JOBCTL_DB_WRITE_WAIT_S, 1 s here: the default
    10 s is the same path, only slower): one line naming H's DB (not the default
    home's) and the fix, exit 2, no traceback, and the run untouched."""
    db = _seeded(tmp_path, monkeypatch)
    db.update_run("b-1", pids=None)  # no node recorded: stop marks it stopped (a write)
    holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer in WAL mode: readers go on, writers wait
    try:
        env = {
            **os.environ,
            "JOBCTL_HOME": str(tmp_path / "elsewhere"),
            "JOBCTL_DB_WRITE_WAIT_S": "1",
        }
        start = time.monotonic()
        done = subprocess.run(
            ["jobctl", "stop", "b-1", "--home", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "locked" in done.stderr and "retry when it is done" in done.stderr
        assert "nothing was changed" in done.stderr and "waited 1 s" in done.stderr
        assert time.monotonic() - start < 30  # the asked 1 s, not the default 10 s
        assert str(tmp_path / "state.db") in done.stderr and "elsewhere" not in done.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    row = db.get_run("b-1")
    assert row["phase"] == "launching" and row["stop_requested"] is None


def test_the_writers_wait_is_the_environments_or_ten_seconds(monkeypatch):
    monkeypatch.delenv("JOBCTL_DB_WRITE_WAIT_S", raising=False)
    assert write_wait_s() == WRITE_WAIT_S == 10.0
    monkeypatch.setenv("JOBCTL_DB_WRITE_WAIT_S", " 2.5 ")
    assert write_wait_s() == 2.5
    for bad in ("soon", "nan", "inf", "-1", "1e9"):
        monkeypatch.setenv("JOBCTL_DB_WRITE_WAIT_S", bad)
        with pytest.raises(StateDBError, match="JOBCTL_DB_WRITE_WAIT_S=.* is not a number"):
            write_wait_s()


def test_a_bad_write_wait_is_one_line_at_the_first_command(tmp_path):
    env = {**os.environ, "JOBCTL_HOME": str(tmp_path), "JOBCTL_DB_WRITE_WAIT_S": "soon"}
    done = subprocess.run(
        ["jobctl", "stop", "nope"], env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "JOBCTL_DB_WRITE_WAIT_S='soon' is not a number of seconds" in done.stderr
    assert "unset it for the default 10 s" in done.stderr
