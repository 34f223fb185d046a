"""``jobctl report RUN``: write the run's self-contained HTML report.

engine/supervise/report_data.py reads the run's archive and simulates its plan;
engine/views/report.py draws the charts, the timeline and the page.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, RunArg, console, err
from jobctl.engine.state.db import StateDB
from jobctl.engine.views.markup import styled
from jobctl.spec import SpecError


def report(
    run: RunArg,
    out: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="HTML file (default <run dir>/report.html)"),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Write an HTML page: throughput over time with morph, preemption, checkpoint and
    upload events marked, the loss curve and the simulated pipeline timeline."""
    db = StateDB(home)
    row = db.get_run(run)
    if row is None:
        err.print(styled("[red]error:[/red] no run {!r}; `jobctl status` lists runs", run))
        raise typer.Exit(2)
    path = write_report(db, row, out, home)
    console.print(f"wrote {path}", markup=False, highlight=False)


def write_report(db: StateDB, row: dict, out: Path | None = None, home: Path | None = None) -> Path:
    """Write the report of the run in ``row`` and its PNGs beside it (``<name>-*.png``);
    returns the page's path. A timeline that cannot be drawn (no spec, a plan that no
    longer fits) is said so among the page's events."""
    # Imported here: matplotlib, which draws the PNGs, loads only for a report.
    from jobctl.engine.supervise.figures import run_figures
    from jobctl.engine.supervise.report_data import collect, simulate_run
    from jobctl.engine.views.report import draw_timeline, render_html, write_pngs

    run_dir = Path(row["run_dir"])
    path = Path(out) if out else run_dir / "report.html"
    stem = path.with_suffix("")
    db_events = db.events(row["id"])
    s = collect(run_dir, db_events, row.get("devices"))
    pngs = write_pngs(s, stem)
    timeline = None
    try:
        step = simulate_run(run_dir, row.get("devices"), home)
        timeline = draw_timeline(step, stem.with_name(f"{stem.name}-timeline.png"))
        pngs.append(timeline.png)
    except (ValueError, OSError, SpecError) as e:  # a plan that no longer fits, no spec
        db_events = [*db_events, {"ts": time.time(), "kind": "report", "message": str(e)}]
    money = run_figures(row, db.events(row["id"]), time.time())
    path.write_text(render_html(row, s, db_events, timeline, pngs, money))
    return path
