"""Run lifecycle queries and requests: ``stop``, ``status``, ``logs``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from jobctl.engine.cli.common import HomeOpt, RunArg, console, err, find_run
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.run_logs import find_logs
from jobctl.engine.supervise.run_requests import ENDED, request_stop
from jobctl.engine.views import tables as views

# What ``stop`` says it did, by Stopping.how.
STOP_MESSAGES = {
    "ended": "run {s.run_id} is already {s.phase}",
    "asked": "asked the supervisor (pid {s.supervisor}) of {s.run_id} to have its nodes "
    "checkpoint and stop",
    "between": "run {s.run_id} stopped; `jobctl resume {s.run_id}` continues it",
    "signalled": "asked {s.nodes} node(s) of {s.run_id} to checkpoint and stop",
}


def stop(run: RunArg, home: HomeOpt = None) -> None:
    """Stop a run gracefully: every rank checkpoints at the end of its step, then exits.

    A supervised run gets the request through the state DB: its supervisor signals the
    nodes running at that moment (after a morph, the new ones), or stops the run there
    if it is between two attempts. Without a live supervisor the recorded nodes are
    signalled directly.
    """
    db = StateDB(home)
    s = request_stop(db, find_run(db, run))
    console.print(STOP_MESSAGES[s.how].format(s=s))


def status(
    run: Annotated[str | None, typer.Argument(help="run id or name")] = None, home: HomeOpt = None
) -> None:
    """Table of runs (phase, step, loss, samples/s, ETA, devices, plan, checkpoints,
    upload lag, $ so far), or one run's details, ranks and recent events."""
    from jobctl.engine.supervise.figures import rank_compute, run_figures, tail_records

    db = StateDB(home)
    now = time.time()
    if run is None:
        rows = db.list_runs()
        figures = {r["id"]: run_figures(r, db.events(r["id"]), now) for r in rows}
        views.print_runs(console, rows, figures, now)
        return
    row = find_run(db, run)
    evs, recs = db.events(row["id"]), tail_records(row["run_dir"])
    figures = run_figures(row, evs, now, recs)
    views.print_run(console, row, evs[-20:], figures, rank_compute(recs), now)


def logs(
    run: RunArg,
    home: HomeOpt = None,
    rank: Annotated[int | None, typer.Option("--rank", help="only this rank")] = None,
    lines: Annotated[int, typer.Option("-n", help="last N lines per file")] = 50,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing new lines")] = False,
) -> None:
    """Show a run's worker logs (all ranks, or one); -f follows until the run ends."""
    db = StateDB(home)
    row = find_run(db, run)
    run_dir = Path(row["run_dir"])
    found = _fetched_logs(row)
    if rank is not None:
        files = [found.get(f"rank-{rank}.log", run_dir / "logs" / f"rank-{rank}.log")]
    else:
        files = [found[name] for name in sorted(found)]
    offsets = {}
    for f in files:
        if not f.exists() and not follow:
            err.print(f"[red]error:[/red] no log {escape(str(f))}")
            raise typer.Exit(2)
        console.rule(f.name)
        text = f.read_text(errors="replace") if f.exists() else ""
        offsets[f] = len(text.encode())
        for line in text.splitlines()[-lines:]:
            console.print(line, markup=False, highlight=False)
    while follow and db.get_run(row["id"])["phase"] not in ENDED:
        time.sleep(0.5)
        for f in (f for f in files if f.exists()):
            with open(f, "rb") as fh:
                fh.seek(offsets[f])
                chunk = fh.read()
            offsets[f] += len(chunk)
            for line in chunk.decode(errors="replace").splitlines():
                console.print(f"{f.stem}: {line}", markup=False, highlight=False)


def _fetched_logs(row: dict) -> dict[str, Path]:
    """The run's log files by name, warning when the nodes' copies could not be fetched."""
    found = find_logs(row)
    if found.warning:
        err.print(f"warning: {found.warning}", markup=False)
    return found.files
