"""``jobctl scale RUN N``: morph a running job onto N devices.

The request is checked (N within elasticity.min_devices..max_devices and the hardware
pool, a layout fits, the run is training) and left in the run folder for the run's
supervisor (engine/supervise/run_requests.py), which stops every rank after a
checkpoint, re-plans for N devices with the same global batch and relaunches
(engine/supervise/scaling.py); the morph is recorded as an event.
"""

from __future__ import annotations

from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, RunArg, console, err
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.run_requests import ScaleRefused, request_scale


def scale(
    run: RunArg,
    devices: Annotated[int, typer.Argument(help="devices to run on from the next checkpoint")],
    home: HomeOpt = None,
) -> None:
    """Morph a running job onto DEVICES devices: checkpoint, re-plan, relaunch."""
    db = StateDB(home)
    row = db.get_run(run)
    if row is None:
        _fail(f"no run {run!r}: `jobctl status` lists the runs")
    if row["phase"] == "completed":  # as `stop` of an ended run: nothing to do, not an error
        console.print(f"run {row['id']} is already complete: nothing to scale", highlight=False)
        return
    try:
        request_scale(row, devices)
    except ScaleRefused as e:
        _fail(str(e))
    console.print(
        f"run {row['id']}: scaling from {row['devices']} to {devices} device(s) after the "
        f"next checkpoint; `jobctl events {row['id']}` shows the morph"
    )


def _fail(message: str) -> None:
    err.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(2)
