"""The state DB records runs, phases and events, by id or by name."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from jobctl.engine.core.phases import PhaseError
from jobctl.engine.state import db as state
from jobctl.engine.state.db import StateDB

from ..supervisor_doubles import training_db


def test_runs_and_events_roundtrip(tmp_path):
    db = StateDB(tmp_path)
    db.create_run("job-1", "job", tmp_path / "runs" / "job-1", total_steps=10, devices=4)
    db.create_run("job-2", "job", tmp_path / "runs" / "job-2", total_steps=10, devices=2)
    db.set_phase("job-2", "launching")
    db.set_phase("job-2", "training", "4 nodes")
    db.update_run("job-2", step=3, loss=1.5)
    db.add_event("job-2", "checkpoint", "checkpoint at step 3", {"step": 3})
    assert db.get_run("job")["id"] == "job-2"  # newest run of that name
    row = db.get_run("job-1")
    assert row["phase"] == "pending" and row["total_steps"] == 10
    r2 = StateDB(tmp_path).get_run("job-2")  # persisted
    assert (r2["phase"], r2["step"], r2["loss"]) == ("training", 3, 1.5)
    kinds = [(e["kind"], e["message"]) for e in db.events("job-2")]
    assert kinds == [
        ("phase", "pending"),
        ("phase", "launching"),
        ("phase", "training: 4 nodes"),
        ("checkpoint", "checkpoint at step 3"),
    ]
    assert db.get_run("missing") is None


def test_sqlite_uses_wal(tmp_path):
    db = StateDB(tmp_path)
    with db.engine.connect() as c:
        assert c.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"


def test_any_sqlalchemy_url(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("JOBCTL_DB_URL", url)
    db = StateDB(tmp_path / "home")
    db.create_run("a", "a", tmp_path)
    assert (tmp_path / "other.db").exists()


def test_illegal_transitions_are_refused(tmp_path):
    db = StateDB(tmp_path)
    db.create_run("r", "r", tmp_path)
    with pytest.raises(PhaseError, match="pending -> completed"):
        db.set_phase("r", "completed")
    for phase in (
        "launching",
        "training",
        "checkpointing",
        "training",
        "morphing",
        "launching",
        "training",
        "completed",
    ):
        db.set_phase("r", phase)
    with pytest.raises(PhaseError, match="terminal"):
        db.set_phase("r", "training")
    assert db.get_run("r")["phase"] == "completed"


def test_a_transition_checks_the_phase_it_replaces(tmp_path, monkeypatch):
    """Supervisor A reads `training`; B moves the run to `morphing` before A writes: A's
    compare-and-set misses, A re-reads and its transition is refused from `morphing`."""
    a = training_db(tmp_path)
    b = StateDB(tmp_path)
    real = state.check_transition
    raced = []

    def check_then_race(current, new):
        if not raced:
            raced.append(current)
            b.set_phase("r", "morphing", "nodes lost")
        return real(current, new)

    monkeypatch.setattr(state, "check_transition", check_then_race)
    with pytest.raises(PhaseError, match="morphing -> checkpointing"):
        a.set_phase("r", "checkpointing")
    assert raced == ["training"] and a.get_run("r")["phase"] == "morphing"
    msgs = [e["message"] for e in a.events("r") if e["kind"] == "phase"]
    assert msgs[-1] == "morphing: nodes lost" and "checkpointing" not in msgs


def test_concurrent_transitions_from_one_phase_have_one_winner(tmp_path):
    training_db(tmp_path)
    dbs = [StateDB(tmp_path) for _ in range(6)]
    with ThreadPoolExecutor(len(dbs)) as pool:
        won = list(pool.map(lambda d: d.set_phase_if("r", {"training"}, "morphing"), dbs))
    assert won.count(True) == 1
    phases = [e["message"] for e in dbs[0].events("r") if e["kind"] == "phase"]
    assert phases.count("morphing") == 1


def test_timestamps_come_from_the_injected_clock(tmp_path):
    now = [50.0]
    db = StateDB(tmp_path, clock=lambda: now[0])
    db.create_run("r", "r", tmp_path)
    now[0] = 60.0
    db.set_phase("r", "calibrating")
    row = db.get_run("r")
    assert (row["created_at"], row["updated_at"]) == (50.0, 60.0)
    assert [e["ts"] for e in db.events("r")] == [50.0, 60.0]


@pytest.mark.parametrize(
    "path",
    [
        ("calibrating", "planning", "launching", "training", "checkpointing", "uploading"),
        ("calibrating", "planning", "launching", "training", "pruning", "rebalancing"),
        ("launching", "morphing", "planning", "launching", "training", "rebalancing", "training"),
        ("launching", "training", "stopped", "calibrating", "planning", "launching"),
        ("launching", "failed", "calibrating"),
        ("launching", "training", "checkpointing", "launching"),  # requeued by its scheduler
    ],
)
def test_legal_paths(tmp_path, path):
    db = StateDB(tmp_path)
    db.create_run("r", "r", tmp_path)
    for phase in path:
        db.set_phase("r", phase, note=f"to {phase}")
        assert db.get_run("r")["phase"] == phase  # each transition took effect
    logged = [e["message"] for e in db.events("r") if e["kind"] == "phase"]
    assert logged == ["pending", *(f"{p}: to {p}" for p in path)]  # one each, in order


@pytest.mark.parametrize(
    "before, illegal",
    [
        ((), "training"),  # pending -> training: never launched
        (("calibrating",), "launching"),  # no plan yet
        (("planning",), "training"),
        (("launching",), "checkpointing"),  # nothing trained yet
        (("launching", "morphing"), "training"),  # a morph relaunches first
        (("launching", "morphing"), "calibrating"),  # the calibration is scale-invariant
        (("launching", "training", "completed"), "calibrating"),
        (("launching", "training", "stopped"), "training"),
    ],
)
def test_illegal_transitions(tmp_path, before, illegal):
    db = StateDB(tmp_path)
    db.create_run("r", "r", tmp_path)
    for phase in before:
        db.set_phase("r", phase)
    with pytest.raises(PhaseError, match=f"-> {illegal}"):
        db.set_phase("r", illegal)
    assert db.get_run("r")["phase"] == (before[-1] if before else "pending")


def test_older_databases_get_the_new_columns(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(
            sa.text(
                "CREATE TABLE runs (id VARCHAR(128) PRIMARY KEY, name VARCHAR(64) "
                "NOT NULL, phase VARCHAR(32) NOT NULL, run_dir TEXT NOT NULL, "
                "created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL)"
            )
        )
        c.execute(sa.text("INSERT INTO runs VALUES ('old', 'old', 'stopped', '/x', 1, 1)"))
        # The events table as the first jobctl made it (every jobctl DB has both tables).
        c.execute(
            sa.text(
                "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id VARCHAR(128) "
                "NOT NULL REFERENCES runs (id), ts FLOAT NOT NULL, kind VARCHAR(32) "
                "NOT NULL, message TEXT NOT NULL, data TEXT)"
            )
        )
    db = StateDB(tmp_path, url=url)
    row = db.get_run("old")
    assert row["phase"] == "stopped" and row["recovery_s"] is None
    db.update_run("old", recovery_s=2.5, supervisor_pid=7)
    assert db.get_run("old")["recovery_s"] == 2.5
