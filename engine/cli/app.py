"""The ``jobctl`` command line.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec, plan or arguments: nothing
was started).
"""

from __future__ import annotations

import sys

import typer

from jobctl.engine.cli.apply import apply, resume
from jobctl.engine.cli.calibrate import calibrate
from jobctl.engine.cli.data import data_app
from jobctl.engine.cli.fleet import fleet_app
from jobctl.engine.cli.plan import plan, render, schema, validate
from jobctl.engine.cli.report import report
from jobctl.engine.cli.runs import logs, status, stop
from jobctl.engine.cli.scale import scale
from jobctl.engine.cli.schedule import events, schedule_app, scheduler_app
from jobctl.engine.state.db import StateDBError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

# One module per command group; the order here is the order of `jobctl --help`.
for command in (validate, schema, plan, calibrate, render, apply, resume):
    app.command()(command)
app.add_typer(fleet_app, name="fleet")
app.add_typer(data_app, name="data")
app.add_typer(schedule_app, name="schedule")
app.add_typer(scheduler_app, name="scheduler")
for command in (events, scale, report, stop, status, logs):
    app.command()(command)


def main() -> None:
    """Console-script entry point; a state DB that cannot be read is one line, exit 2."""
    try:
        sys.exit(app())
    except StateDBError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
