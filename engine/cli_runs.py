"""Run lifecycle queries and requests: ``stop``, ``status``, ``logs``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from . import views
from .cli_common import HomeOpt, console, err, find_run
from .state import StateDB


def stop(run: Annotated[str, typer.Argument(help="run id or name")], home: HomeOpt = None) -> None:
    """Stop a run gracefully: every rank checkpoints at the end of its step, then exits."""
    import signal

    from jobctl.backends import get_backend

    db = StateDB(home)
    row = find_run(db, run)
    if row["phase"] in ("completed", "failed", "stopped"):
        console.print(f"run {row['id']} is already {row['phase']}")
        return
    handles = [h for h in (row["pids"] or "").split(",") if h]
    # SIGTERM reaches every node's torchrun agent, which forwards it to its workers.
    get_backend(row["backend"] or "local").cancel(handles, signal.SIGTERM)
    db.add_event(row["id"], "stop", f"SIGTERM sent to {len(handles)} node(s)")
    console.print(f"asked {len(handles)} node(s) of {row['id']} to checkpoint and stop")


def status(
    run: Annotated[str | None, typer.Argument(help="run id or name")] = None, home: HomeOpt = None
) -> None:
    """Table of runs, or one run's details and recent events."""
    db = StateDB(home)
    if run is None:
        views.print_runs(console, db.list_runs())
        return
    row = find_run(db, run)
    views.print_run(console, row, db.events(row["id"], limit=20))


def logs(
    run: Annotated[str, typer.Argument(help="run id or name")],
    home: HomeOpt = None,
    rank: Annotated[int | None, typer.Option("--rank", help="only this rank")] = None,
    lines: Annotated[int, typer.Option("-n", help="last N lines per file")] = 50,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing new lines")] = False,
) -> None:
    """Show a run's worker logs (all ranks, or one); -f follows until the run ends."""
    db = StateDB(home)
    row = find_run(db, run)
    log_dir = Path(row["run_dir"]) / "logs"
    files = [log_dir / f"rank-{rank}.log"] if rank is not None else sorted(log_dir.glob("*.log"))
    offsets = {}
    for f in files:
        if not f.exists() and not follow:
            err.print(f"[red]error:[/red] no log {f}")
            raise typer.Exit(2)
        console.rule(f.name)
        text = f.read_text(errors="replace") if f.exists() else ""
        offsets[f] = len(text.encode())
        for line in text.splitlines()[-lines:]:
            console.print(line, markup=False, highlight=False)
    while follow and db.get_run(row["id"])["phase"] not in ("completed", "failed", "stopped"):
        time.sleep(0.5)
        for f in (f for f in files if f.exists()):
            with open(f, "rb") as fh:
                fh.seek(offsets[f])
                chunk = fh.read()
            offsets[f] += len(chunk)
            for line in chunk.decode(errors="replace").splitlines():
                console.print(f"{f.stem}: {line}", markup=False, highlight=False)
