"""``jobctl report RUN``: write the run's self-contained HTML report (engine/views/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobctl.engine.state.db import StateDB

console = Console()
err = Console(stderr=True, soft_wrap=True)


def report(
    run: Annotated[str, typer.Argument(help="run id or name")],
    out: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="HTML file (default <run dir>/report.html)"),
    ] = None,
    home: Annotated[
        Path | None, typer.Option("--home", help="state dir (default $JOBCTL_HOME or ./.jobctl)")
    ] = None,
) -> None:
    """Write an HTML page: throughput over time with morph, preemption, checkpoint and
    upload events marked, the loss curve and the simulated pipeline timeline."""
    from jobctl.engine.views.report import write_report

    db = StateDB(home)
    row = db.get_run(run)
    if row is None:
        err.print(f"[red]error:[/red] no run {run!r}; `jobctl status` lists runs")
        raise typer.Exit(2)
    path = write_report(db, row, out, home)
    console.print(f"wrote {path}", markup=False, highlight=False)
