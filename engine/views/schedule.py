"""Rich renderings of schedules, job leases and a job's event timeline for the terminal."""

from __future__ import annotations

import time
from itertools import groupby
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # `jobctl events` prints a timeline without the scheduler's imports
    from jobctl.engine.recurring.book import ScheduleRow
    from jobctl.engine.state.leases import Lease


def when(row: ScheduleRow) -> str:
    """A schedule's next trigger in local time; ``-`` when it has none."""
    return row.next_run.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") if row.next_run else "-"


def print_schedules(console: Console, rows: list[ScheduleRow]) -> None:
    """Table of schedules: rule, next trigger, paused or not, last event."""
    if not rows:
        console.print("no schedules: `jobctl schedule add JOB --every SECONDS` adds one")
        return
    t = Table("job", "rule", "next trigger", "state", "last event")
    for r in rows:
        t.add_row(r.job, r.rule, when(r), "paused" if r.paused else "active", r.last_event or "-")
    console.print(t)


def print_leases(console: Console, leases: list[Lease], now: float) -> None:
    """Table of job leases at ``now``: who may launch each job, and until when."""
    t = Table("job", "owner", "child pid", "state", "expires")
    for lease in leases:
        state = "held" if lease.live(now) else "released" if lease.released_at else "expired"
        t.add_row(
            lease.job,
            lease.owner,
            str(lease.child_pid or "-"),
            state,
            time.strftime("%H:%M:%S", time.localtime(lease.expires_at)),
        )
    console.print(t)


def print_timeline(console: Console, rows: list[dict]) -> None:
    """A job's events, oldest first: a heading per source (a run, the scheduler, the
    fleet runner) and its events' time, kind and the message's first line. A run id
    is a heading line of its own, never a column cut to "varuna-20261207-14…" at 80
    columns (#47); the date goes in the heading where a source's events share one."""
    for source, group in groupby(rows, key=lambda e: e["source"]):
        group = list(group)
        days = {time.strftime("%Y-%m-%d", time.localtime(e["ts"])) for e in group}
        one_day = len(days) == 1
        console.print(Text(f"{source}" + (f" ({days.pop()})" if one_day else ""), "bold"))
        t = Table("time", "kind", "message")
        for e in group:
            t.add_row(
                time.strftime(
                    "%H:%M:%S" if one_day else "%Y-%m-%d %H:%M:%S", time.localtime(e["ts"])
                ),
                e["kind"],
                e["message"].splitlines()[0],
            )
        console.print(t)
