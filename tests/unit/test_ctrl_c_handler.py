"""Ctrl-C on a foreground apply: the SIGINT handler must not touch the state DB on the
interrupted thread, which may hold SQLite's write lock mid-transaction (a CI run's
first Ctrl-C failed the run with "database is locked" after the 10 s busy wait)."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest
from rich.console import Console

from jobctl.engine.state.db import StateDB, runs
from jobctl.engine.supervise.service import CtrlC


def _db_with_run(tmp_path, phase="training"):
    db = StateDB(home=tmp_path)
    db.create_run("r1", "job", tmp_path / "r1")
    db.update_run("r1", phase=phase)  # placed directly: the walk there is not the point
    return db


def test_first_ctrl_c_inside_a_write_transaction_records_the_stop(tmp_path):
    db = _db_with_run(tmp_path)
    console = Console(file=io.StringIO())
    t0 = time.monotonic()
    # the supervisor mid-write, holding the lock, when the SIGINT lands
    with CtrlC(db, "job", console) as ctrl_c, db.engine.begin() as c:
        c.execute(runs.update().where(runs.c.id == "r1").values(step=3))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler has run; it must have returned at once
        assert ctrl_c.interrupted
    assert time.monotonic() - t0 < 5  # no busy wait on our own lock
    row = db.get_run("r1")
    assert row["stop_requested"] is not None and row["step"] == 3
    assert [e["kind"] for e in db.events("r1")].count("stop") == 1  # #47: was listed twice


def test_second_ctrl_c_detaches(tmp_path):
    db = _db_with_run(tmp_path)
    console = Console(file=io.StringIO())
    with pytest.raises(KeyboardInterrupt), CtrlC(db, "job", console):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)


@pytest.mark.parametrize("phase", [None, "completed"])
def test_ctrl_c_with_no_live_run_interrupts_at_once(tmp_path, phase):
    db = _db_with_run(tmp_path, phase) if phase else StateDB(home=tmp_path)
    console = Console(file=io.StringIO())
    with pytest.raises(KeyboardInterrupt), CtrlC(db, "job", console):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert phase is None or db.get_run("r1")["stop_requested"] is None
