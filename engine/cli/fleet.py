"""``jobctl fleet ...``: plan, apply, watch, stop and resume fleets of templated runs.

Exit codes as for ``jobctl``: 0 success, 1 a member failed (or the fleet was stopped),
2 bad input (fleet file, a member's spec or plan, arguments: nothing was started).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, console, err
from jobctl.engine.fleet.db import FleetDB
from jobctl.engine.fleet.loader import Fleet, load_fleet
from jobctl.engine.fleet.members import member_rows
from jobctl.engine.fleet.planning import FleetPlan, plan_fleet, record_fleet
from jobctl.engine.fleet.runner import FleetBusy, FleetRunner
from jobctl.engine.fleet.stopping import stop_fleet
from jobctl.engine.recurring.procs import hostname
from jobctl.engine.state.db import StateDB
from jobctl.engine.views.fleet import FleetProgress, print_fleet_plan, print_fleet_status
from jobctl.engine.views.markup import styled
from jobctl.spec import SpecError

fleet_app = typer.Typer(
    no_args_is_help=True, help="Fleets: one templated job spec, many runs, one device pool."
)
FleetArg = Annotated[Path, typer.Argument(help="fleet YAML file", show_default=False)]
NameArg = Annotated[str, typer.Argument(help="fleet name", show_default=False)]
ConcurrentOpt = Annotated[
    int | None, typer.Option("--max-concurrent", min=1, help="members running at once at most")
]
PollOpt = Annotated[float, typer.Option("--poll", min=0.05, help="seconds between checks")]


def _fail(message: str) -> typer.Exit:
    err.print(styled("[red]error:[/red] {}", message), highlight=False)
    return typer.Exit(2)


def _invalid(path: Path, e: SpecError) -> typer.Exit:
    err.print(styled("[red]error:[/red] {}: invalid fleet ({} issue(s))", path, len(e.errors)))
    err.print(str(e), highlight=False, markup=False)
    return typer.Exit(2)


def _loaded(path: Path) -> Fleet:
    """Load the fleet file and render every member, or report every issue and exit 2."""
    try:
        return load_fleet(path)
    except SpecError as e:
        raise _invalid(path, e) from None


def _planned(fleet: Fleet, path: Path, max_concurrent: int | None) -> FleetPlan:
    """Plan every member of the loaded ``fleet``, or report every issue and exit 2."""
    try:
        return plan_fleet(fleet, max_concurrent)
    except SpecError as e:
        raise _invalid(path, e) from None


@fleet_app.command("plan")
def plan(fleet_file: FleetArg, max_concurrent: ConcurrentOpt = None) -> None:
    """Every member's changes against the base, predicted step time, throughput and
    cost, and the fleet's total; starts nothing."""
    print_fleet_plan(console, _planned(_loaded(fleet_file), fleet_file, max_concurrent))


@fleet_app.command("apply")
def apply(
    fleet_file: FleetArg,
    max_concurrent: ConcurrentOpt = None,
    home: HomeOpt = None,
    poll: PollOpt = 1.0,
) -> None:
    """Plan the fleet, then run its members in the shared pool until all have ended."""
    fleet = _loaded(fleet_file)
    # The DB first, as `apply` does: a damaged or locked one is one line, with no plan
    # printed before it and no planning done for nothing (#46 item 9)
    db = StateDB(home)
    fleets = FleetDB(db)
    fp = _planned(fleet, fleet_file, max_concurrent)
    print_fleet_plan(console, fp)
    name, now = fp.fleet.spec.name, time.time()
    old = fleets.get(name)
    if old is not None and fleets.runner_alive(old, now):
        raise _fail(f"fleet {name} is running ({old['runner_owner']}); `jobctl fleet stop` it")
    record_fleet(fleets, fp, now)
    _run(db, name, poll)


@fleet_app.command("resume")
def resume(
    name: NameArg, max_concurrent: ConcurrentOpt = None, home: HomeOpt = None, poll: PollOpt = 1.0
) -> None:
    """Continue an interrupted fleet: completed members are skipped, members still
    running are adopted, the others continue their runs from their newest checkpoints."""
    db = StateDB(home)
    fleets = FleetDB(db)
    if fleets.get(name) is None:
        raise _fail(f"no fleet {name!r}; `jobctl fleet status` lists fleets")
    if max_concurrent is not None:
        fleets.update(name, time.time(), max_concurrent=max_concurrent)
    _run(db, name, poll)


def _run(db: StateDB, name: str, poll: float) -> None:
    with FleetProgress(console) as progress:

        def tick(members: list[dict]) -> None:
            progress.update(member_rows(db, members))

        runner = FleetRunner(db, name, poll_s=poll, on_tick=tick)
        stops = (signal.SIGTERM, signal.SIGINT)
        previous = {s: signal.signal(s, lambda *_: runner.request_stop()) for s in stops}
        try:
            state = runner.run()
        except FleetBusy as e:
            raise _fail(str(e)) from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    _show(db, name)
    if state != "completed":
        raise typer.Exit(1)


def _show(db: StateDB, name: str) -> None:
    fleets = FleetDB(db)
    row = fleets.get(name)
    runner = "none"
    if row["runner_owner"]:
        alive = fleets.runner_alive(row, time.time())
        runner = f"{row['runner_owner']} ({'alive' if alive else 'dead'})"
    print_fleet_status(console, row, member_rows(db, fleets.members(name)), runner)


@fleet_app.command("status")
def status(
    name: Annotated[str | None, typer.Argument(help="fleet name")] = None, home: HomeOpt = None
) -> None:
    """A fleet's members (state, phase, step, loss, run id), or the list of fleets."""
    db = StateDB(home)
    fleets = FleetDB(db)
    if name is None:
        rows = fleets.list()
        for r in rows:
            console.print(f"{r['name']}: {r['state']} ({r['file']})", highlight=False)
        if not rows:
            console.print("no fleets yet: `jobctl fleet apply fleet.yaml` starts one")
        return
    if fleets.get(name) is None:
        raise _fail(f"no fleet {name!r}; `jobctl fleet status` lists fleets")
    _show(db, name)


@fleet_app.command("stop")
def stop(name: NameArg, home: HomeOpt = None) -> None:
    """Stop a fleet: no more members start, running ones are stopped (resumable)."""
    db = StateDB(home)
    fleets = FleetDB(db)
    row = fleets.get(name)
    if row is None:
        raise _fail(f"no fleet {name!r}; `jobctl fleet status` lists fleets")
    stopped = stop_fleet(fleets, row)
    if stopped is None:
        console.print(f"fleet {name} is complete; nothing to stop")
        return
    for m in stopped:
        console.print(f"stopped {m['member']} (pid {m['pid']} on {hostname()})")
    _show(db, name)
