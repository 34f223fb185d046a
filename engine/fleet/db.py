"""Fleets and their members in the state DB, so a fleet outlives its runner.

``fleets`` holds one row per fleet (its file, pool, state and the runner that drives
it, with a heartbeat); ``fleet_members`` one row per member: its rendered spec, the
devices its plan needs, its state (pending, running, completed, failed, stopped), the
process running it and when it started and ended. ``fleet status`` reads them;
``fleet resume`` continues from them after the runner was killed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from jobctl.engine.recurring.procs import hostname, pid_alive
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import ensure_tables

metadata = sa.MetaData()

fleets = sa.Table(
    "fleets",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("file", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("pool_devices", sa.Integer, nullable=False),
    sa.Column("max_concurrent", sa.Integer, nullable=False),
    sa.Column("runner_owner", sa.String(128)),
    sa.Column("runner_host", sa.String(255)),
    sa.Column("runner_pid", sa.Integer),
    sa.Column("runner_token", sa.String(64)),
    sa.Column("heartbeat_at", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

fleet_members = sa.Table(
    "fleet_members",
    metadata,
    sa.Column("fleet", sa.String(128), primary_key=True),
    sa.Column("member", sa.String(64), primary_key=True),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("devices", sa.Integer, nullable=False),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("spec_yaml", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(128)),
    sa.Column("pid", sa.Integer),
    sa.Column("pid_token", sa.String(64)),
    sa.Column("log_path", sa.Text),
    sa.Column("launches", sa.Integer, nullable=False, default=0),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    sa.Column("exit_code", sa.Integer),
)

HEARTBEAT_STALE_S = 60.0


@dataclass(frozen=True)
class MemberRecord:
    """What a fleet records of a member before it runs."""

    member: str
    idx: int
    devices: int
    params: dict
    spec_yaml: str


class FleetDB:
    """Read and write fleets and fleet members."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        self.engine = db.engine
        ensure_tables(self.engine, metadata, [fleets, fleet_members])

    def create(
        self,
        name: str,
        file: str,
        pool: int,
        max_concurrent: int,
        members: list[MemberRecord],
        now: float,
    ) -> None:
        """Record a fleet afresh (replacing an earlier one of that name), all pending."""
        with self.engine.begin() as c:
            c.execute(fleet_members.delete().where(fleet_members.c.fleet == name))
            c.execute(fleets.delete().where(fleets.c.name == name))
            c.execute(
                fleets.insert().values(
                    name=name,
                    file=file,
                    state="pending",
                    pool_devices=pool,
                    max_concurrent=max_concurrent,
                    created_at=now,
                    updated_at=now,
                )
            )
            for m in members:
                c.execute(
                    fleet_members.insert().values(
                        fleet=name,
                        member=m.member,
                        idx=m.idx,
                        devices=m.devices,
                        params=json.dumps(m.params, default=str),
                        spec_yaml=m.spec_yaml,
                        state="pending",
                        launches=0,
                    )
                )

    def get(self, name: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(fleets.select().where(fleets.c.name == name)).mappings().first()
        return dict(row) if row else None

    def list(self) -> list[dict]:
        with self.engine.connect() as c:
            q = fleets.select().order_by(fleets.c.created_at.desc())
            return [dict(r) for r in c.execute(q).mappings().all()]

    def members(self, name: str) -> list[dict]:
        q = fleet_members.select().where(fleet_members.c.fleet == name)
        with self.engine.connect() as c:
            rows = c.execute(q.order_by(fleet_members.c.idx)).mappings().all()
        return [dict(r) for r in rows]

    def update(self, name: str, now: float, **values) -> None:
        with self.engine.begin() as c:
            c.execute(fleets.update().where(fleets.c.name == name).values(updated_at=now, **values))

    def update_member(
        self, name: str, member: str, *, only_if: tuple[str, ...] = (), **values
    ) -> bool:
        """Update a member (only while its state is one of ``only_if``, if given)."""
        where = [fleet_members.c.fleet == name, fleet_members.c.member == member]
        if only_if:
            where.append(fleet_members.c.state.in_(only_if))
        with self.engine.begin() as c:
            return c.execute(fleet_members.update().where(*where).values(**values)).rowcount == 1

    def count_launch(self, name: str, member: str, **values) -> None:
        """Mark a member running and count the launch."""
        self.update_member(
            name, member, state="running", launches=fleet_members.c.launches + 1, **values
        )

    def runner_alive(self, row: dict, now: float) -> bool:
        """Whether the fleet's runner lives: its pid on this host, its heartbeat elsewhere."""
        if row["runner_owner"] is None:
            return False
        if row["runner_host"] == hostname():
            return pid_alive(row["runner_pid"], row["runner_token"])
        return now - (row["heartbeat_at"] or 0.0) < HEARTBEAT_STALE_S

    def claim_runner(self, name: str, seen_owner: str | None, now: float, **runner) -> bool:
        """Become the fleet's runner if the one seen (dead, or none) is still recorded."""
        same = (
            fleets.c.runner_owner.is_(None)
            if seen_owner is None
            else fleets.c.runner_owner == seen_owner
        )
        values = dict(heartbeat_at=now, updated_at=now, state="running", **runner)
        with self.engine.begin() as c:
            done = c.execute(fleets.update().where(fleets.c.name == name, same).values(**values))
        return done.rowcount == 1

    def release_runner(self, name: str, owner: str, state: str, now: float) -> None:
        mine = sa.and_(fleets.c.name == name, fleets.c.runner_owner == owner)
        cleared = dict(runner_owner=None, runner_pid=None, runner_token=None, state=state)
        with self.engine.begin() as c:
            c.execute(fleets.update().where(mine).values(updated_at=now, **cleared))
