"""The persisted schedules: add, list, pause, resume and remove them in the state DB.

A schedule is an apscheduler job in the ``apscheduler_jobs`` table with the job name as
its id, :func:`~jobctl.engine.recurring.trigger.fire` as its callable and
``{"job": name, "spec": path}`` as arguments; its human description (``every 30 s``,
``cron '0 */6 * * *' Europe/Berlin``) is kept as the apscheduler job's name. The book
opens the same store as the daemon, paused, so it never fires anything itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from apscheduler.jobstores.base import JobLookupError

from jobctl.engine.recurring.daemon import DEFAULT_GRACE_S, Daemon
from jobctl.engine.recurring.store import cron_weekdays as cron_weekdays  # re-exported
from jobctl.engine.recurring.store import rule_json, trigger_for
from jobctl.engine.recurring.trigger import Trigger, fire
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents
from jobctl.spec import ScheduleSpec


class NoSuchSchedule(LookupError):
    """The named job has no schedule."""


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as ``jobctl schedule list`` shows it."""

    job: str
    rule: str
    next_run: datetime | None
    spec: str | None
    grace_s: int | None
    last_event: str | None

    @property
    def paused(self) -> bool:
        return self.next_run is None


def describe(rule: ScheduleSpec) -> str:
    """``every 30 s (UTC)`` or ``cron '0 */6 * * *' (Europe/Berlin)``, plus the window."""
    what = f"every {rule.interval_s:g} s" if rule.interval_s is not None else f"cron '{rule.cron}'"
    text = f"{what} ({rule.timezone})"
    if rule.start is not None:
        text += f" from {rule.start.isoformat(sep=' ')}"
    if rule.end is not None:
        text += f" until {rule.end.isoformat(sep=' ')}"
    return text


class ScheduleBook:
    """The schedules in one state DB; use as a context manager."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        self.events = JobEvents(db, "scheduler")
        self._store = Daemon(db, Trigger(db))

    def __enter__(self) -> ScheduleBook:
        self._store.start(paused=True)
        return self

    def __exit__(self, *exc) -> None:
        self._store.shutdown(wait=False)

    def add(
        self, job: str, rule: ScheduleSpec, spec: str | None, grace_s: int | None = None
    ) -> ScheduleRow:
        """Create or replace the schedule of ``job``."""
        grace = DEFAULT_GRACE_S if grace_s is None else grace_s
        existed = self._store.get_job(job) is not None
        self._store.add_job(
            fire,
            trigger=trigger_for(rule),
            id=job,
            name=describe(rule),
            kwargs={"job": job, "spec": spec, "rule": rule_json(rule)},
            misfire_grace_time=grace,
            replace_existing=True,
        )
        verb = "replaced" if existed else "added"
        self._event(job, f"{verb}: {describe(rule)}, misfire grace {grace:g} s")
        return self.get(job)

    def get(self, job: str) -> ScheduleRow:
        found = self._store.get_job(job)
        if found is None:
            raise NoSuchSchedule(job)
        return self._row(found)

    def list(self) -> list[ScheduleRow]:
        return [self._row(j) for j in self._store.get_jobs()]

    def pause(self, job: str) -> ScheduleRow:
        self._call(self._store.pause_job, job)
        self._event(job, "paused")
        return self.get(job)

    def resume(self, job: str) -> ScheduleRow:
        self._call(self._store.resume_job, job)
        self._event(job, "resumed")
        return self.get(job)

    def remove(self, job: str) -> None:
        self._call(self._store.remove_job, job)
        self._event(job, "removed")

    def _call(self, method, job: str) -> None:
        try:
            method(job)
        except JobLookupError:
            raise NoSuchSchedule(job) from None

    def _event(self, job: str, message: str) -> None:
        self.events.add(job, "schedule", message, time.time())

    def _row(self, job) -> ScheduleRow:
        mine = self.events.list(job.id)
        last = f"{mine[-1]['kind']}: {mine[-1]['message']}" if mine else None
        return ScheduleRow(
            job=job.id,
            rule=job.name,
            next_run=job.next_run_time,
            spec=job.kwargs.get("spec"),
            grace_s=job.misfire_grace_time,
            last_event=last,
        )
