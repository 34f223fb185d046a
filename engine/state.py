"""Runs and their events in a SQL database (SQLite file by default).

The state directory is ``./.jobctl`` unless ``JOBCTL_HOME`` or ``--home`` says
otherwise; the database URL defaults to ``sqlite:///<home>/state.db`` (WAL mode) and
can be any SQLAlchemy URL through ``JOBCTL_DB_URL``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import sqlalchemy as sa

from .phases import check_transition

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("name", sa.String(64), index=True, nullable=False),
    sa.Column("phase", sa.String(32), nullable=False),
    sa.Column("spec_path", sa.Text),
    sa.Column("spec_hash", sa.String(64)),
    sa.Column("run_dir", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("step", sa.Integer, default=0),
    sa.Column("total_steps", sa.Integer),
    sa.Column("loss", sa.Float),
    sa.Column("samples_per_s", sa.Float),
    sa.Column("devices", sa.Integer),
    sa.Column("plan", sa.Text),
    sa.Column("last_checkpoint", sa.Integer),
    sa.Column("last_upload", sa.Integer),
    sa.Column("stragglers", sa.Text),
    sa.Column("exit_code", sa.Integer),
    sa.Column("message", sa.Text),
    sa.Column("pids", sa.Text),  # backend handles of the nodes (pids, job ids, host:pid)
    sa.Column("backend", sa.String(32)),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id"), index=True, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("data", sa.Text),
)


def default_home() -> Path:
    """``JOBCTL_HOME`` or ``./.jobctl``."""
    return Path(os.environ.get("JOBCTL_HOME", ".jobctl")).resolve()


def _sqlite_wal(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


class StateDB:
    """Persistent record of runs and events."""

    def __init__(self, home: Path | None = None, url: str | None = None):
        self.home = Path(home) if home else default_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.url = url or os.environ.get("JOBCTL_DB_URL") or f"sqlite:///{self.home / 'state.db'}"
        self.engine = sa.create_engine(self.url)
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_wal)
        metadata.create_all(self.engine)

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def create_run(self, run_id: str, name: str, run_dir: Path, **fields) -> None:
        now = time.time()
        with self.engine.begin() as c:
            c.execute(
                runs.insert().values(
                    id=run_id,
                    name=name,
                    run_dir=str(run_dir),
                    phase="pending",
                    created_at=now,
                    updated_at=now,
                    **fields,
                )
            )
        self.add_event(run_id, "phase", "pending")

    def update_run(self, run_id: str, **fields) -> None:
        with self.engine.begin() as c:
            c.execute(
                runs.update().where(runs.c.id == run_id).values(updated_at=time.time(), **fields)
            )

    def set_phase(self, run_id: str, phase: str, note: str = "", **fields) -> None:
        """Record a legal phase transition (and any run fields) with its event."""
        row = self.get_run(run_id)
        check_transition(row["phase"] if row else "pending", phase)
        self.update_run(run_id, phase=phase, **fields)
        self.add_event(run_id, "phase", f"{phase}{': ' + note if note else ''}")

    def get_run(self, ref: str) -> dict | None:
        """A run by id, or the newest run with that name."""
        with self.engine.connect() as c:
            row = c.execute(runs.select().where(runs.c.id == ref)).mappings().first()
            if row is None:
                q = runs.select().where(runs.c.name == ref).order_by(runs.c.created_at.desc())
                row = c.execute(q).mappings().first()
        return dict(row) if row else None

    def list_runs(self) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(runs.select().order_by(runs.c.created_at.desc())).mappings().all()
        return [dict(r) for r in rows]

    def add_event(self, run_id: str, kind: str, message: str, data: dict | None = None) -> None:
        with self.engine.begin() as c:
            c.execute(
                events.insert().values(
                    run_id=run_id,
                    ts=time.time(),
                    kind=kind,
                    message=message,
                    data=json.dumps(data) if data else None,
                )
            )

    def events(self, run_id: str, limit: int | None = None) -> list[dict]:
        q = events.select().where(events.c.run_id == run_id).order_by(events.c.id.desc())
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [dict(r) for r in reversed(rows)]
