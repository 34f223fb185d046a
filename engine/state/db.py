"""Runs and their events in a SQL database (SQLite file by default).

The state directory is ``./.jobctl`` unless ``JOBCTL_HOME`` or ``--home`` says
otherwise; the database URL defaults to ``sqlite:///<home>/state.db`` (WAL mode) and
can be any SQLAlchemy URL through ``JOBCTL_DB_URL``.

A phase transition is one transaction: the legality check, a compare-and-set update of
the phase and its event commit together or not at all, so two supervisors (or a
supervisor and a CLI command) can never both move a run out of the same phase.
Timestamps come from an injectable wall clock (``clock``) so tests control time.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from jobctl.engine.core.env import DB_URL
from jobctl.engine.core.home import default_home
from jobctl.engine.core.phases import PhaseError, check_transition
from jobctl.engine.state.reader import StateDBError as StateDBError  # re-exported
from jobctl.engine.state.reader import db_error, home_error, note_opened, url_error, write_wait_s

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
    # Added after the first release: ``_add_missing_columns`` upgrades older databases.
    sa.Column("supervisor_pid", sa.Integer),  # the process supervising the run, if any
    sa.Column("stop_requested", sa.Float),  # wall time of a pending `jobctl stop`
    sa.Column("recovery_s", sa.Float),  # last recovery: node lost -> next training step
    sa.Column("uploading_step", sa.Integer),  # checkpoint step uploading in the background
    # The supervisor's start time (``process_token``): its pid alone may be reused later.
    sa.Column("supervisor_token", sa.String(32)),
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


@contextlib.contextmanager
def _reading(url: str) -> Iterator[None]:
    """Turn a damaged, locked or foreign DB into one :class:`StateDBError` (no traceback)."""
    try:
        yield
    except sa.exc.IntegrityError:
        raise
    except (sa.exc.DBAPIError, sa.exc.NoSuchTableError) as e:
        raise db_error(url, e) from None


def _clean(row: Mapping[str, Any], table: sa.Table) -> dict[str, Any]:
    """``row`` with every value of its column's type: a nonsense value (text in a number
    column, written by hand or by another program) reads as None, not as a crash later."""
    out = dict(row)
    for name, value in out.items():
        column = table.columns.get(name)
        if value is None or column is None:
            continue
        wanted = column.type.python_type
        if wanted is float and type(value) is int:
            out[name] = float(value)
        elif not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            out[name] = str(value) if wanted is str else None
    return out


CAS_RETRIES = 8  # a transition that keeps losing its compare-and-set gives up (never seen)


def _sqlite_busy(dbapi_conn, _record) -> None:
    """Wait for another process's lock as a writer does (a supervisor commits often)."""
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={round(write_wait_s() * 1000)}")
    cur.close()


def _sqlite_wal(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=0")
    # Another process writing a DB still in rollback mode: switching needs it to finish,
    # but reading does not (`status` must work meanwhile); a later connection switches.
    with contextlib.suppress(sqlite3.OperationalError):
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={round(write_wait_s() * 1000)}")
    cur.close()


def _add_missing_columns(engine: sa.Engine) -> None:
    """Add columns this version knows and an older database lacks (all nullable)."""
    have = {c["name"] for c in sa.inspect(engine).get_columns("runs")}
    with engine.begin() as c:
        for col in runs.columns:
            if col.name not in have:
                kind = col.type.compile(dialect=engine.dialect)
                c.execute(sa.text(f"ALTER TABLE runs ADD COLUMN {col.name} {kind}"))


def _refuse_partial(url: str, engine: sa.Engine) -> None:
    """A DB with one of ``runs`` and ``events`` but not the other (every jobctl DB has
    had both) was renamed or damaged by hand: creating the missing one empty would hide
    every run from ``status`` with no word, so say so instead."""
    have = set(sa.inspect(engine).get_table_names()) & {"runs", "events"}
    if len(have) == 1:
        missing = ({"runs", "events"} - have).pop()
        raise db_error(url, RuntimeError(f"no such table: {missing} (it has {have.pop()})"))


# The columns every jobctl DB has had since the first release: a table by one of our
# names that lacks one is another program's, which adding our columns would deface.
FIRST_RELEASE = {
    "runs": {"id", "name", "phase", "run_dir", "created_at", "updated_at"},
    "events": {"id", "run_id", "ts", "kind", "message", "data"},
}


def _refuse_foreign(url: str, engine: sa.Engine) -> None:
    """A ``runs`` or ``events`` table that is not jobctl's is refused, unchanged (#46
    item 12: a foreign ``runs`` table was given jobctl's columns and written to)."""
    inspector = sa.inspect(engine)
    for table in sorted(set(inspector.get_table_names()) & set(FIRST_RELEASE)):
        have = {c["name"] for c in inspector.get_columns(table)}
        missing = sorted(FIRST_RELEASE[table] - have)
        if missing:
            why = f"table {table} is not jobctl's (no column {', '.join(missing)})"
            raise db_error(url, RuntimeError(why))


class StateDB:
    """Persistent record of runs and events."""

    def __init__(
        self,
        home: Path | None = None,
        url: str | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.home = Path(home) if home else default_home()
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise home_error(self.home, e) from None
        self.url = url or os.environ.get(DB_URL) or f"sqlite:///{self.home / 'state.db'}"
        self.clock = clock
        write_wait_s()  # a bad JOBCTL_DB_WRITE_WAIT_S is one line now, not at a write
        note_opened(self.url)
        try:
            self.engine = sa.create_engine(self.url)
        except (ImportError, ValueError, sa.exc.ArgumentError) as e:
            raise url_error(self.url, e) from None
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_busy)
        with _reading(self.url):
            # Judged before WAL mode is set: switching it rewrites the file's header,
            # and a DB that is not jobctl's is refused unchanged.
            _refuse_foreign(self.url, self.engine)
            _refuse_partial(self.url, self.engine)
            if self.engine.dialect.name == "sqlite":
                self.engine.dispose()  # the connection that judged it has no WAL mode
                sa.event.listen(self.engine, "connect", _sqlite_wal)
            metadata.create_all(self.engine)
            _add_missing_columns(self.engine)

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def create_run(self, run_id: str, name: str, run_dir: Path, **fields) -> None:
        now = self.clock()
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
            self._event(c, run_id, "phase", "pending")

    def update_run(self, run_id: str, **fields) -> None:
        with self.engine.begin() as c:
            c.execute(
                runs.update().where(runs.c.id == run_id).values(updated_at=self.clock(), **fields)
            )

    def set_phase(self, run_id: str, phase: str, note: str = "", **fields) -> None:
        """Record a legal phase transition (and any run fields) with its event.

        Raises ``PhaseError`` when the run's current phase may not go to ``phase``.
        """
        self._transition(run_id, phase, note, fields, None)

    def set_phase_if(
        self, run_id: str, expected: Collection[str], phase: str, note: str = "", **fields
    ) -> bool:
        """``set_phase`` only while the run is in one of ``expected``; False otherwise."""
        return self._transition(run_id, phase, note, fields, set(expected))

    def _transition(
        self, run_id: str, phase: str, note: str, fields: dict, expected: set[str] | None
    ) -> bool:
        # Read, check and write in one transaction; the update only matches the phase that
        # was read, so a concurrent transition makes it match nothing and this one re-reads.
        for _ in range(CAS_RETRIES):
            with self.engine.begin() as c:
                current = c.execute(sa.select(runs.c.phase).where(runs.c.id == run_id)).scalar()
                if current is None:
                    raise PhaseError(f"no run {run_id!r} to move to {phase!r}")
                if expected is not None and current not in expected:
                    return False
                check_transition(current, phase)
                done = c.execute(
                    runs.update()
                    .where(runs.c.id == run_id, runs.c.phase == current)
                    .values(phase=phase, updated_at=self.clock(), **fields)
                )
                if done.rowcount == 1:
                    self._event(c, run_id, "phase", f"{phase}{': ' + note if note else ''}")
                    return True
        raise PhaseError(f"run {run_id}: the phase kept changing underneath {phase!r}")

    def claim_supervisor(
        self,
        run_id: str,
        pid: int,
        alive: Callable[[int, str | None], bool],
        token: str | None = None,
    ) -> int | None:
        """Make ``pid`` (started at ``token``) the run's supervisor unless another live
        process is: ``alive(pid, token)`` of the recorded one (a reused pid is not it).

        Returns None once claimed (a pending stop request is dropped with it: resuming a
        run is asking it to run), else the pid of the live supervisor that holds it.
        """
        for _ in range(CAS_RETRIES):
            row = self.get_run(run_id)
            old = row["supervisor_pid"] if row else None
            if old not in (None, pid) and alive(old, row["supervisor_token"]):
                return old
            with self.engine.begin() as c:
                done = c.execute(
                    runs.update()
                    .where(runs.c.id == run_id, _is(runs.c.supervisor_pid, old))
                    .values(
                        supervisor_pid=pid,
                        supervisor_token=token,
                        stop_requested=None,
                        updated_at=self.clock(),
                    )
                )
            if done.rowcount == 1:
                return None
        raise RuntimeError(f"run {run_id}: its supervisor kept changing underneath")

    def release_supervisor(self, run_id: str, pid: int) -> None:
        """Forget ``pid`` as the run's supervisor (if it still is)."""
        with self.engine.begin() as c:
            c.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.supervisor_pid == pid)
                .values(supervisor_pid=None, supervisor_token=None)
            )

    def request_stop(self, run_id: str, note: str) -> float:
        """Record a stop request for the run's supervisor to apply; its time."""
        now = self.clock()
        with self.engine.begin() as c:
            c.execute(runs.update().where(runs.c.id == run_id).values(stop_requested=now))
            self._event(c, run_id, "stop", note)
        return now

    def get_run(self, ref: str) -> dict | None:
        """A run by id, or the newest run with that name."""
        with _reading(self.url), self.engine.connect() as c:
            row = c.execute(runs.select().where(runs.c.id == ref)).mappings().first()
            if row is None:
                q = runs.select().where(runs.c.name == ref).order_by(runs.c.created_at.desc())
                row = c.execute(q).mappings().first()
        return _clean(row, runs) if row else None

    def list_runs(self) -> list[dict]:
        with _reading(self.url), self.engine.connect() as c:
            rows = c.execute(runs.select().order_by(runs.c.created_at.desc())).mappings().all()
        return [_clean(r, runs) for r in rows]

    def add_event(self, run_id: str, kind: str, message: str, data: dict | None = None) -> None:
        with self.engine.begin() as c:
            self._event(c, run_id, kind, message, data)

    def _event(self, c, run_id: str, kind: str, message: str, data: dict | None = None) -> None:
        c.execute(
            events.insert().values(
                run_id=run_id,
                ts=self.clock(),
                kind=kind,
                message=message,
                data=json.dumps(data) if data else None,
            )
        )

    def events(self, run_id: str, limit: int | None = None) -> list[dict]:
        q = events.select().where(events.c.run_id == run_id).order_by(events.c.id.desc())
        if limit:
            q = q.limit(limit)
        with _reading(self.url), self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [_clean(r, events) for r in reversed(rows)]


def _is(column, value):
    """``column = value`` that also matches NULL for None."""
    return column.is_(None) if value is None else column == value
