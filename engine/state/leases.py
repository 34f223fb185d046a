"""Leases and control events in the state DB: who may launch a job, and what happened.

A lease row (``leases``) is the one place that decides which process may start a copy
of a job: it is claimed with a single conditional ``UPDATE ... WHERE expired`` (or an
``INSERT`` racing on the primary key), so two schedulers on one database, on one host
or many, never both win. The holder renews it while its child runs and releases it when
the child exits; a holder that dies simply lets it expire. Apscheduler's own locking
only covers one scheduler process, which is why this exists.

Control events (``job_events``) record what the scheduler and the fleet runner decided
about a job or fleet by name, including names that have no run yet; ``jobctl events``
shows them beside the runs' own events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from jobctl.engine.state.db import StateDB, runs
from jobctl.engine.state.db import events as run_events

metadata = sa.MetaData()

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("job", sa.String(191), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("child_pid", sa.Integer),
    sa.Column("child_token", sa.String(64)),
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.Column("renewed_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("released_at", sa.Float),
)

job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(191), index=True, nullable=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("data", sa.Text),
    sa.Column("owner", sa.String(128)),
)


def ensure_tables(engine: sa.Engine, meta: sa.MetaData, tables: list[sa.Table]) -> None:
    """``create_all`` that survives another process creating the same tables meanwhile
    (two daemons starting on a fresh DB): the second try sees them and skips them."""
    try:
        meta.create_all(engine, tables=tables)
    except (sa.exc.OperationalError, sa.exc.ProgrammingError):
        meta.create_all(engine, tables=tables)


@dataclass(frozen=True)
class Lease:
    """One row of ``leases``."""

    job: str
    owner: str
    host: str
    pid: int
    child_pid: int | None
    child_token: str | None
    claimed_at: float
    renewed_at: float
    expires_at: float
    released_at: float | None

    def live(self, now: float) -> bool:
        """Held by someone: not released and not expired."""
        return self.released_at is None and self.expires_at > now


class Leases:
    """Claim, renew, attach a child to, and release per-job leases."""

    def __init__(self, db: StateDB) -> None:
        self.engine = db.engine
        ensure_tables(self.engine, metadata, [leases])

    def get(self, job: str) -> Lease | None:
        with self.engine.connect() as c:
            row = c.execute(leases.select().where(leases.c.job == job)).mappings().first()
        return Lease(**row) if row else None

    def all(self) -> list[Lease]:
        with self.engine.connect() as c:
            rows = c.execute(leases.select().order_by(leases.c.job)).mappings().all()
        return [Lease(**r) for r in rows]

    def claim(self, job: str, owner: str, host: str, pid: int, now: float, ttl: float) -> bool:
        """Take the lease if it is free, expired or already ours; True if we hold it now."""
        values = dict(
            owner=owner,
            host=host,
            pid=pid,
            child_pid=None,
            child_token=None,
            claimed_at=now,
            renewed_at=now,
            expires_at=now + ttl,
            released_at=None,
        )
        free = sa.or_(
            leases.c.expires_at <= now, leases.c.released_at.is_not(None), leases.c.owner == owner
        )
        # The WHERE is evaluated under the row's write lock (SQLite's database lock,
        # Postgres' row lock), so of two racing claimers only one matches it.
        with self.engine.begin() as c:
            taken = c.execute(leases.update().where(leases.c.job == job, free).values(**values))
        if taken.rowcount == 1:
            return True
        try:
            with self.engine.begin() as c:
                c.execute(leases.insert().values(job=job, **values))
        except sa.exc.IntegrityError:  # the row exists and is live: someone else holds it
            return False
        return True

    def renew(self, job: str, owner: str, now: float, ttl: float) -> bool:
        """Extend our lease; False if it is no longer ours (it expired and was taken)."""
        return self._update_ours(job, owner, renewed_at=now, expires_at=now + ttl)

    def attach(self, job: str, owner: str, child_pid: int, child_token: str | None) -> bool:
        """Record the child process that our lease now covers."""
        return self._update_ours(job, owner, child_pid=child_pid, child_token=child_token)

    def release(self, job: str, owner: str, now: float) -> bool:
        """Give the lease back (the row stays, as a record of the last holder)."""
        return self._update_ours(job, owner, expires_at=now, released_at=now)

    def _update_ours(self, job: str, owner: str, **values) -> bool:
        mine = sa.and_(leases.c.job == job, leases.c.owner == owner, leases.c.released_at.is_(None))
        with self.engine.begin() as c:
            return c.execute(leases.update().where(mine).values(**values)).rowcount == 1


class JobEvents:
    """Scheduler and fleet events, keyed by job (or fleet) name."""

    def __init__(self, db: StateDB, source: str, owner: str | None = None) -> None:
        self.engine = db.engine
        self.source = source
        self.owner = owner
        ensure_tables(self.engine, metadata, [job_events])

    def add(self, job: str, kind: str, message: str, now: float, data: dict | None = None) -> None:
        with self.engine.begin() as c:
            c.execute(
                job_events.insert().values(
                    job=job,
                    ts=now,
                    source=self.source,
                    kind=kind,
                    message=message,
                    data=json.dumps(data) if data else None,
                    owner=self.owner,
                )
            )

    def list(self, job: str | None = None, kind: str | None = None) -> list[dict]:
        """Events, oldest first, of one job and/or one kind."""
        q = job_events.select().order_by(job_events.c.id)
        if job is not None:
            q = q.where(job_events.c.job == job)
        if kind is not None:
            q = q.where(job_events.c.kind == kind)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings().all()]


def timeline(db: StateDB, ref: str) -> list[dict]:
    """Every event of a job, oldest first: its runs' own events (``ref`` is a run id or a
    job name) and the scheduler's and fleet runner's events about that name."""
    ensure_tables(db.engine, metadata, [job_events])
    with db.engine.connect() as c:
        q = sa.select(runs.c.id, runs.c.name).where(sa.or_(runs.c.id == ref, runs.c.name == ref))
        found = c.execute(q).all()
        ids = [r.id for r in found]
        names = {r.name for r in found} | {ref}
        q = run_events.select().where(run_events.c.run_id.in_(ids))
        rows = [{**r, "source": r["run_id"]} for r in c.execute(q).mappings().all()]
        q = job_events.select().where(job_events.c.job.in_(names))
        rows += [dict(r) for r in c.execute(q).mappings().all()]
    return sorted(rows, key=lambda r: r["ts"])
