"""Run lifecycle queries and requests: ``stop``, ``status``, ``logs``, ``events``.

None of these plans or trains: they read the state DB (``engine.state.reader``: a
SQLite file through ``sqlite3``, without SQLAlchemy) and import the views only (never
torch), so they start fast; ``stop`` loads the backends only when it signals nodes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, RunArg, console, err, find_run
from jobctl.engine.views.markup import styled

ENDED = ("completed", "failed", "stopped")  # as engine/supervise/run_requests.ENDED

# What ``stop`` says it did, by Stopping.how.
STOP_MESSAGES = {
    "ended": "run {s.run_id} is already {s.phase}",
    "asked": "asked the supervisor (pid {s.supervisor}) of {s.run_id} to have its nodes "
    "checkpoint and stop",
    "between": "run {s.run_id} stopped; `jobctl resume {s.run_id}` continues it",
    "signalled": "asked {s.nodes} node(s) of {s.run_id} to checkpoint and stop",
}


def stop(
    run: RunArg,
    home: HomeOpt = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="return once asked, not once it has stopped")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for it to stop at most")
    ] = 300.0,
) -> None:
    """Stop a run gracefully: every rank checkpoints at the end of its step, then exits.

    A supervised run gets the request through the state DB: its supervisor signals the
    nodes running at that moment (after a morph, the new ones), or stops the run there
    if it is between two attempts; this waits until it has stopped and its supervisor
    has ended, so `jobctl resume` can follow at once. Without a live supervisor the
    recorded nodes are signalled directly.
    """
    from jobctl.engine.state.db import StateDB
    from jobctl.engine.supervise.run_requests import request_stop

    db = StateDB(home)
    s = request_stop(db, find_run(db, run))
    console.print(STOP_MESSAGES[s.how].format(s=s))
    if s.how == "asked" and not no_wait:
        _await_stopped(db, s.run_id, timeout)


def _await_stopped(db, run_id: str, timeout: float) -> None:
    """Wait (bounded) until the run has ended and its supervisor with it; say how."""
    from jobctl.engine.core.process import pid_alive

    deadline = time.monotonic() + timeout
    with console.status(f"waiting for {run_id}'s nodes to checkpoint and stop"):
        while time.monotonic() < deadline:
            row = db.get_run(run_id)
            sup = row["supervisor_pid"]  # cleared by a supervisor that has finished
            if row["phase"] in ENDED and not pid_alive(sup, row["supervisor_token"]):
                break
            time.sleep(0.5)
        else:
            console.print(
                f"still stopping after {timeout:g} s; `jobctl status {run_id}` follows it"
            )
            return
    done = row["last_checkpoint"]
    if row["phase"] == "stopped":
        where = f"its newest checkpoint is step {done}" if done else "no checkpoint was made"
        console.print(
            f"run {run_id} stopped at step {row['step']} ({where}); "
            f"`jobctl resume {run_id}` continues it"
        )
    else:
        console.print(f"run {run_id} {row['phase']} at step {row['step']} before it stopped")


def status(
    run: Annotated[str | None, typer.Argument(help="run id or name")] = None,
    home: HomeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the runs as JSON")] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="redraw every --interval s until the runs end")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="seconds between redraws")] = 2.0,
) -> None:
    """Table of runs, or one run's details, ranks and recent events (--json, --watch).

    The table keeps run, phase, step, loss and ETA in any terminal and adds samples/s,
    devices, plan, checkpoints, upload lag and $ so far as the width allows.
    """
    from jobctl.engine.state.reader import read_state

    db = read_state(home)
    if run is not None:
        run = find_run(db, run)["id"]
    while True:
        if watch and not as_json:
            console.clear()
        rows = _show_status(db, run, as_json)
        if not watch or all(r["phase"] in ENDED for r in rows):
            return
        time.sleep(interval)


def _show_status(db, run: str | None, as_json: bool) -> list[dict]:
    """Print the runs (or the one run ``run``) once; the rows shown."""
    from jobctl.engine.supervise.figures import rank_compute, run_bounds, run_figures, tail_records
    from jobctl.engine.views import status as views

    now = time.time()
    rows = db.list_runs() if run is None else [db.get_run(run)]
    rows = [_supervision(r) for r in rows]
    recs = tail_records(rows[0]["run_dir"], bounds=run_bounds(rows[0])) if run is not None else []
    figures = {
        r["id"]: run_figures(r, db.events(r["id"]), now, *([recs] if run else [])) for r in rows
    }
    if as_json:
        from jobctl.engine.core.events import finite

        # NaN is not JSON: a non-finite figure (an eval loss of NaN) is null (#46 item 5)
        doc = finite(views.runs_json(rows, figures, now))
        print(json.dumps(doc, indent=2, default=str, allow_nan=False))
    elif run is None:
        views.print_runs(console, rows, figures, now)
    else:
        evs = db.events(run)
        views.print_run(console, rows[0], evs[-20:], figures[run], rank_compute(recs), now)
    return rows


def _supervision(row: dict) -> dict:
    """``row`` with ``unsupervised`` set when it is not ended and no live process
    supervises it (its supervisor detached on Ctrl-C, or died): its nodes may still
    train, and `jobctl resume` adopts them."""
    from jobctl.engine.core.process import pid_alive

    sup = row.get("supervisor_pid")
    alive = bool(sup) and pid_alive(sup, row.get("supervisor_token"))
    return {**row, "unsupervised": row["phase"] not in ENDED and not alive}


def logs(
    run: RunArg,
    home: HomeOpt = None,
    rank: Annotated[int | None, typer.Option("--rank", help="only this rank")] = None,
    lines: Annotated[int, typer.Option("-n", help="last N lines per file")] = 50,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing new lines")] = False,
) -> None:
    """Show a run's worker logs (all ranks, or one); -f follows until the run ends."""
    from jobctl.engine.state.reader import read_state

    db = read_state(home)
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
            err.print(styled("[red]error:[/red] no log {}", f))
            raise typer.Exit(2)
        console.rule(f.name)
        text = f.read_text(errors="replace") if f.exists() else ""
        offsets[f] = len(text.encode())
        for line in text.splitlines()[-lines:]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)  # as logged
    while follow and db.get_run(row["id"])["phase"] not in ENDED:
        time.sleep(0.5)
        for f in (f for f in files if f.exists()):
            with open(f, "rb") as fh:
                fh.seek(offsets[f])
                chunk = fh.read()
            offsets[f] += len(chunk)
            for line in chunk.decode(errors="replace").splitlines():
                console.print(f"{f.stem}: {line}", markup=False, highlight=False, soft_wrap=True)


def _fetched_logs(row: dict) -> dict[str, Path]:
    """The run's log files by name, warning when the nodes' copies could not be fetched."""
    from jobctl.engine.supervise.run_logs import find_logs

    found = find_logs(row)
    if found.warning:
        err.print(f"warning: {found.warning}", markup=False)
    return found.files


def events(
    ref: Annotated[str, typer.Argument(help="run id, job name or fleet name")],
    home: HomeOpt = None,
    last: Annotated[int, typer.Option("-n", help="only the last N events")] = 0,
) -> None:
    """Events of a job: its runs' phases and progress, and the scheduler's and fleet
    runner's decisions about it (triggers, skips, launches, exits)."""
    from jobctl.engine.state.reader import read_state, timeline
    from jobctl.engine.views.schedule import print_timeline

    rows = timeline(read_state(home), ref)
    if not rows:
        err.print(styled("[red]error:[/red] no events for {!r}; `jobctl status` lists runs", ref))
        raise typer.Exit(2)
    print_timeline(console, rows[-last:] if last else rows)
