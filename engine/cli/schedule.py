"""``jobctl schedule ...`` and ``jobctl scheduler run`` (``jobctl events`` is in runs).

Schedules resume a job from its newest complete checkpoint on a cron rule or interval;
they live in the state DB, so ``schedule add`` works while a daemon runs elsewhere and
the daemon picks them up within its poll interval. Exit codes as for ``jobctl``: 0 ok,
2 bad input (nothing was changed).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from jobctl.engine.cli.common import HomeOpt, console, err
from jobctl.engine.recurring.book import NoSuchSchedule, ScheduleBook
from jobctl.engine.recurring.daemon import Daemon
from jobctl.engine.recurring.trigger import Trigger
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import Leases
from jobctl.engine.views.markup import styled
from jobctl.engine.views.schedule import print_leases, print_schedules, when
from jobctl.spec import ScheduleSpec, SpecError, load_spec

schedule_app = typer.Typer(no_args_is_help=True, help="Resume jobs on a cron rule or interval.")
scheduler_app = typer.Typer(no_args_is_help=True, help="The daemon that fires schedules.")

JobArg = Annotated[str, typer.Argument(help="job name", show_default=False)]


def _fail(message: str) -> typer.Exit:
    err.print(styled("[red]error:[/red] {}", message), highlight=False)
    return typer.Exit(2)


def _target(db: StateDB, ref: str) -> tuple[str, str | None, ScheduleSpec | None]:
    """Job name, spec file and the spec's own schedule, from a spec file or a run."""
    path = Path(ref)
    if not path.is_file():
        path = _scheduled_spec(db, ref) or path
    if path.is_file():
        try:
            spec = load_spec(path)
        except SpecError as e:
            err.print(styled("[red]error:[/red] {}: invalid job spec", path), highlight=False)
            err.print(str(e), highlight=False, markup=False)
            raise typer.Exit(2) from None
        return spec.name, str(path.resolve()), spec.schedule
    run = db.get_run(ref)
    if run is None:
        raise _fail(f"{ref!r} is neither a job spec file nor a job with a run or a schedule")
    try:
        rule = load_spec(Path(run["run_dir"]) / "spec.yaml").schedule
    except (SpecError, FileNotFoundError):
        rule = None  # the flags must say when
    return run["name"], run["spec_path"], rule


def _scheduled_spec(db: StateDB, job: str) -> Path | None:
    """The spec file of a job that is scheduled but has not run yet."""
    if db.get_run(job) is not None:
        return None
    with ScheduleBook(db) as book:
        try:
            spec = book.get(job).spec
        except NoSuchSchedule:
            return None
    return Path(spec) if spec else None


def _rule(
    rule: ScheduleSpec | None, cron: str | None, every: float | None, tz: str | None
) -> ScheduleSpec:
    """The spec's schedule with the command-line flags applied over it."""
    if rule is None and cron is None and every is None:
        raise _fail("no schedule: give --cron or --every, or add a `schedule:` section")
    fields = rule.model_dump() if rule is not None else {}
    if cron is not None or every is not None:
        fields.update(cron=cron, interval_s=every)
    if tz is not None:
        fields["timezone"] = tz
    try:
        return ScheduleSpec.model_validate(fields)
    except ValidationError as e:
        flag = {"cron": "--cron", "interval_s": "--every", "timezone": "--timezone"}
        lines = [
            f"{flag.get(str(x['loc'][0]), x['loc'][0]) if x['loc'] else 'schedule'}: {x['msg']}"
            for x in e.errors()
        ]
        raise _fail("invalid schedule\n" + "\n".join(lines)) from None


@schedule_app.command("add")
def add(
    job_or_spec: Annotated[str, typer.Argument(help="job spec file, or the name of a job")],
    cron: Annotated[str | None, typer.Option("--cron", help="5-field cron rule")] = None,
    every: Annotated[
        float | None, typer.Option("--every", help="seconds between triggers", min=0.001)
    ] = None,
    tz: Annotated[str | None, typer.Option("--timezone", help="IANA zone of the rule")] = None,
    grace: Annotated[
        int | None,
        typer.Option("--grace", min=1, help="seconds a late trigger still runs (misfire grace)"),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Resume a job from its newest checkpoint on a rule (replaces its schedule)."""
    db = StateDB(home)
    name, spec_path, rule = _target(db, job_or_spec)
    full = _rule(rule, cron, every, tz)
    with ScheduleBook(db) as book:
        row = book.add(name, full, spec_path, grace)
    console.print(f"scheduled {name}: {row.rule}; next trigger {when(row)}", highlight=False)


@schedule_app.command("list")
def list_(home: HomeOpt = None) -> None:
    """Table of schedules: rule, next trigger, paused or not, last event."""
    with ScheduleBook(StateDB(home)) as book:
        rows = book.list()
    print_schedules(console, rows)


def _change(job: str, home: Path | None, action: str) -> None:
    with ScheduleBook(StateDB(home)) as book:
        try:
            getattr(book, action)(job)
        except NoSuchSchedule:
            raise _fail(f"no schedule for {job!r}; `jobctl schedule list` shows them") from None
    console.print(f"{job}: schedule {action}d")


@schedule_app.command("remove")
def remove(job: JobArg, home: HomeOpt = None) -> None:
    """Delete a job's schedule."""
    _change(job, home, "remove")


@schedule_app.command("pause")
def pause(job: JobArg, home: HomeOpt = None) -> None:
    """Stop triggering a job until `schedule resume`."""
    _change(job, home, "pause")


@schedule_app.command("resume")
def resume(job: JobArg, home: HomeOpt = None) -> None:
    """Trigger a paused schedule again (its next time is computed from now)."""
    _change(job, home, "resume")


@scheduler_app.command("run")
def run(
    once: Annotated[
        bool, typer.Option("--once", help="fire what is due, wait for those runs, exit")
    ] = False,
    poll: Annotated[
        float, typer.Option("--poll", help="seconds between passes at most", min=0.05)
    ] = 5.0,
    ttl: Annotated[float, typer.Option("--ttl", help="lease time to live, seconds", min=1)] = 60.0,
    home: HomeOpt = None,
) -> None:
    """The scheduler daemon: resume scheduled jobs that are neither running nor complete.

    Runs start as `jobctl resume` child processes (logs under <home>/scheduler/logs) and
    keep running if the daemon stops; a lease per job keeps any number of daemons on one
    state DB from starting two copies. SIGTERM or Ctrl-C stops it.
    """
    db = StateDB(home)
    trigger = Trigger(db, ttl_s=ttl, console=console)
    daemon = Daemon(db, trigger, poll_s=min(poll, ttl / 3))
    previous = {s: signal.signal(s, lambda *_: daemon.stop()) for s in _STOP_SIGNALS}
    where = db.engine.url.render_as_string(hide_password=True)
    console.print(f"scheduler {trigger.owner} on {where}" + (" (one pass)" if once else ""))
    try:
        daemon.serve(once=once)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@scheduler_app.command("leases")
def leases(home: HomeOpt = None) -> None:
    """Table of job leases: who may launch each job, and until when."""
    now = time.time()
    print_leases(console, Leases(StateDB(home)).all(), now)
