"""The state DB records runs, phases and events, by id or by name."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobctl.engine.phases import PhaseError
from jobctl.engine.state import StateDB


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
