"""Options and look-ups shared by the ``jobctl`` command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobctl.engine.state.db import StateDB

console = Console()
err = Console(stderr=True, soft_wrap=True)

HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="state dir (default $JOBCTL_HOME or ./.jobctl)")
]
RunArg = Annotated[str, typer.Argument(help="run id or name")]


def find_run(db: StateDB, ref: str) -> dict:
    """The run ``ref`` names (id, or the newest run of that name); exit 2 if none."""
    row = db.get_run(ref)
    if row is None:
        err.print(f"[red]error:[/red] no run {ref!r}; `jobctl status` lists runs")
        raise typer.Exit(2)
    return row
