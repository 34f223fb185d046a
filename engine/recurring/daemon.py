"""``jobctl scheduler run``: the daemon that fires persisted schedules.

An apscheduler 3 scheduler whose job store is a table of plain data in the state DB
(engine/recurring/store: no pickles), so schedules survive restarts and every daemon on
that DB sees the same ones. Due triggers are coalesced (many missed firings of a resume
are one resume) and a trigger later than its ``misfire_grace_time`` is recorded as
missed. The daemon is one thread: a loop of "fire what is due, renew and reap children,
wait" that wakes at least every ``poll_s`` so schedules added by other processes are
noticed, driven by :meth:`Daemon.serve` (``once=True`` for one pass) and stopped by
:meth:`Daemon.stop`.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

import sqlalchemy as sa
from apscheduler.events import (
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    EVENT_JOB_REMOVED,
    JobEvent,
    JobExecutionEvent,
)
from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.base import BaseScheduler

from jobctl.engine.recurring.store import DataJobStore
from jobctl.engine.recurring.trigger import Trigger
from jobctl.engine.state.db import StateDB

DEFAULT_GRACE_S = 600
log = logging.getLogger(__name__)


class TriggerExecutor(BaseExecutor):
    """Hands due schedules to the daemon's :class:`Trigger`, in the daemon's own thread.

    Firing takes a few DB statements and at most one process start, so there is no
    pool; the stored callable gets the trigger, which holds what cannot be stored in
    the job store (the leases and child processes of this daemon).
    """

    def __init__(self, trigger: Trigger) -> None:
        super().__init__()
        self.trigger = trigger

    def _do_submit_job(self, job, run_times) -> None:
        events = []
        for run_time in run_times:
            now = datetime.fromtimestamp(self.trigger.clock(), timezone.utc)
            late_s = (now - run_time).total_seconds()
            alias = job._jobstore_alias
            if job.misfire_grace_time is not None and late_s > job.misfire_grace_time:
                self.trigger.missed(job.id, run_time, late_s)
                events.append(JobExecutionEvent(EVENT_JOB_MISSED, job.id, alias, run_time))
                continue
            kind = job.func(*job.args, trigger=self.trigger, scheduled=run_time, **job.kwargs)
            events.append(JobExecutionEvent(EVENT_JOB_EXECUTED, job.id, alias, run_time, kind))
        self._run_job_success(job.id, events)


class Daemon(BaseScheduler):
    """Persisted schedules in, trigger decisions out."""

    def __init__(
        self,
        db: StateDB,
        trigger: Trigger | None = None,
        *,
        poll_s: float = 5.0,
        grace_s: int = DEFAULT_GRACE_S,
    ) -> None:
        self.db = db
        self.trigger = trigger or Trigger(db)
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._stopping = False
        super().__init__(
            jobstores={"default": DataJobStore(db.engine)},
            executors={"default": TriggerExecutor(self.trigger)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": grace_s},
            timezone=timezone.utc,
        )
        self.add_listener(self._on_removed, EVENT_JOB_REMOVED)

    def _on_removed(self, event: JobEvent) -> None:
        # Only the daemon's own pass removes jobs: a trigger past its window's end.
        self.trigger.record(event.job_id, "schedule", "removed: no trigger left in its window")

    def wakeup(self) -> None:
        self._wake.set()

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait)
        self._stopping = True

    def stop(self) -> None:
        """Ask :meth:`serve` to return; safe from a signal handler (sets a flag only)."""
        self._stopping = True

    def serve(self, once: bool = False) -> None:
        """Fire due schedules until :meth:`stop`; ``once``: one pass, then wait for the
        runs it started (renewing their leases) and return."""
        self.start()
        try:
            self._loop(once)
        finally:
            self.trigger.shutdown()
            self.shutdown(wait=False)

    def _loop(self, once: bool) -> None:
        while not self._stopping:
            self._wake.clear()
            due_in = self._pass()
            self._tick()
            if once:
                break
            self._wake.wait(self.poll_s if due_in is None else min(due_in, self.poll_s))
        while once and self.trigger.children and not self._stopping:
            self._wake.clear()
            self._wake.wait(self.poll_s)
            self._tick()

    def _pass(self) -> float | None:
        """Fire what is due; seconds until the next schedule is due (None: none is)."""
        for _ in range(3):
            try:
                return self._process_jobs()
            except JobLookupError as e:
                # Another process removed a schedule while this pass fired it (`schedule
                # remove`, or another daemon at its window's end): the rest of the pass
                # did not run, so run it again.
                log.info("schedule removed during a pass (%s); processing again", e)
        return 0.0

    def _tick(self) -> None:
        try:
            self.trigger.tick()
        except sa.exc.OperationalError as e:
            # The DB is briefly unreachable or locked: retry next pass. If it stays away
            # past the lease time, renewal fails then and the child is stopped, as it must.
            log.warning("cannot renew leases this pass: %s", e)
