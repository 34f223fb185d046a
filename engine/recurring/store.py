"""The schedules' job store: plain data in the state DB, never pickles.

apscheduler's ``SQLAlchemyJobStore`` pickles each job into the state DB, so a row planted
there ran code when `jobctl schedule list` unpickled it. This store keeps what a schedule
is (the job, its spec path, its rule: the spec's ``schedule`` section as JSON, the
misfire grace and the next run time) as JSON, and rebuilds the apscheduler job and its
trigger from the rule. A row that does not read back is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.job import Job
from apscheduler.jobstores.base import BaseJobStore, ConflictingIdError, JobLookupError
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from apscheduler.util import datetime_to_utc_timestamp, utc_timestamp_to_datetime
from pydantic import ValidationError
from sqlalchemy import Column, Float, MetaData, Table, Text, Unicode, delete, func, insert, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import table as sa_table
from sqlalchemy import update as sql_update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from jobctl.spec import ScheduleSpec

TABLE = "jobctl_schedules"
LEGACY_TABLE = "apscheduler_jobs"  # apscheduler's SQLAlchemyJobStore: pickled jobs
FIRE = "jobctl.engine.recurring.trigger:fire"  # the one callable every schedule names
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
log = logging.getLogger(__name__)


def cron_weekdays(field: str) -> str:
    """Cron's day-of-week field (0 or 7 = Sunday) as apscheduler 3 reads it (0 = Monday).

    Apscheduler 3 numbers weekdays from Monday, so ``1-5`` would mean Tuesday to
    Saturday there; the days are spelled out by name instead, which it reads correctly.
    """
    if field == "*":
        return field
    days: set[int] = set()
    for item in field.lower().split(","):
        base, _, step = item.partition("/")
        if base == "*":
            lo, hi = 0, 6
        else:
            first, _, last = base.partition("-")
            lo = _day(first)
            hi = _day(last) if last else (6 if step else lo)
            hi = 7 if hi == 0 and last else hi  # "5-0" / "fri-sun": Sunday ends the range
        days.update(d % 7 for d in range(lo, hi + 1, int(step or 1)))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def _day(token: str) -> int:
    return _DAY_NAMES.index(token[:3]) if token[:3] in _DAY_NAMES else int(token)


def trigger_for(rule: ScheduleSpec) -> BaseTrigger:
    """The apscheduler trigger of a spec's ``schedule`` section."""
    tz = ZoneInfo(rule.timezone)
    window = {"start_date": rule.start, "end_date": rule.end, "timezone": tz}
    if rule.interval_s is not None:
        return IntervalTrigger(seconds=rule.interval_s, **window)
    minute, hour, day, month, weekday = rule.cron.split()
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=cron_weekdays(weekday),
        **window,
    )


def rule_json(rule: ScheduleSpec) -> str:
    """The rule as the store keeps it."""
    return rule.model_dump_json()


class DataJobStore(BaseJobStore):
    """apscheduler 3's job store interface over one table of JSON rows."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine
        self.table = Table(
            TABLE,
            MetaData(),
            Column("id", Unicode(191), primary_key=True),
            Column("next_run_time", Float(25), index=True),
            Column("state", Text, nullable=False),
        )

    def start(self, scheduler, alias) -> None:
        super().start(scheduler, alias)
        self.table.create(self.engine, checkfirst=True)
        self._note_legacy_rows()

    def _note_legacy_rows(self) -> None:
        """Schedules of an older jobctl sit pickled in ``apscheduler_jobs``: never read
        (unpickling runs code), so say how to bring them back."""
        if not sa_inspect(self.engine).has_table(LEGACY_TABLE):
            return
        with self.engine.begin() as conn:
            count = conn.execute(select(func.count()).select_from(sa_table(LEGACY_TABLE))).scalar()
        if count:
            log.warning(
                "%d schedule(s) of an older jobctl in table %s are not read (pickled rows can "
                "run code); add them again with `jobctl schedule add`",
                count,
                LEGACY_TABLE,
            )

    def lookup_job(self, job_id: str) -> Job | None:
        found = self._jobs(self.table.c.id == job_id)
        return found[0] if found else None

    def get_due_jobs(self, now: datetime) -> list[Job]:
        return self._jobs(self.table.c.next_run_time <= datetime_to_utc_timestamp(now))

    def get_next_run_time(self) -> datetime | None:
        column = self.table.c.next_run_time
        query = select(column).where(column.isnot(None)).order_by(column).limit(1)
        with self.engine.begin() as conn:
            return utc_timestamp_to_datetime(conn.execute(query).scalar())

    def get_all_jobs(self) -> list[Job]:
        jobs = self._jobs(None)
        self._fix_paused_jobs_sorting(jobs)
        return jobs

    def add_job(self, job: Job) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(self.table).values(**self._row(job)))
        except IntegrityError:
            raise ConflictingIdError(job.id) from None

    def update_job(self, job: Job) -> None:
        row = self._row(job)
        query = sql_update(self.table).where(self.table.c.id == job.id).values(**row)
        with self.engine.begin() as conn:
            if conn.execute(query).rowcount == 0:
                raise JobLookupError(job.id)

    def remove_job(self, job_id: str) -> None:
        with self.engine.begin() as conn:
            if conn.execute(delete(self.table).where(self.table.c.id == job_id)).rowcount == 0:
                raise JobLookupError(job_id)

    def remove_all_jobs(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(self.table))

    def shutdown(self) -> None:
        """The engine is the state DB's; it outlives this store."""

    def _row(self, job: Job) -> dict[str, Any]:
        state = {
            "job": job.kwargs["job"],
            "spec": job.kwargs.get("spec"),
            "rule": job.kwargs["rule"],
            "name": job.name,
            "misfire_grace_time": job.misfire_grace_time,
        }
        when = datetime_to_utc_timestamp(job.next_run_time)
        return {"id": job.id, "next_run_time": when, "state": json.dumps(state)}

    def _jobs(self, where) -> list[Job]:
        query = select(self.table).order_by(self.table.c.next_run_time)
        query = query if where is None else query.where(where)
        with self.engine.begin() as conn:
            rows = conn.execute(query).all()
        jobs = []
        for row in rows:
            try:
                jobs.append(self._job(row.id, row.next_run_time, json.loads(row.state)))
            except (ValueError, KeyError, TypeError, ValidationError) as e:
                log.warning("schedule %r: skipped, its row does not read back: %s", row.id, e)
        return jobs

    def _job(self, job_id: str, next_run: float | None, state: dict[str, Any]) -> Job:
        rule = ScheduleSpec.model_validate_json(state["rule"])
        kwargs = {"job": str(state["job"]), "spec": state["spec"], "rule": rule_json(rule)}
        job = Job.__new__(Job)
        job.__setstate__(
            {
                "id": job_id,
                "func": FIRE,
                "trigger": trigger_for(rule),
                "executor": "default",
                "args": (),
                "kwargs": kwargs,
                "name": str(state["name"]),
                "misfire_grace_time": state["misfire_grace_time"],
                "coalesce": True,
                "max_instances": 1,
                "next_run_time": utc_timestamp_to_datetime(next_run),
            }
        )
        job._scheduler, job._jobstore_alias = self._scheduler, self._alias
        return job
