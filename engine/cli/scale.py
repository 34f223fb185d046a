"""``jobctl scale RUN N``: morph a running job onto N devices.

The request is checked here (N within elasticity.min_devices..max_devices and the
hardware pool, and a layout fits) and left in the run folder for the run's supervisor,
which stops every rank after a checkpoint, re-plans for N devices with the same global
batch and relaunches (engine/supervise/scaling.py); the morph is recorded as an event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.scaling import ScaleRequest, check_devices, write_request
from jobctl.spec import SpecError, load_spec

LIVE = {"launching", "training", "pruning", "rebalancing", "checkpointing", "uploading"}
# Phases of a live run between two attempts: a request now would die with the old one.
BETWEEN = {"pending", "calibrating", "planning", "morphing"}

console = Console()
err = Console(stderr=True, soft_wrap=True)


def scale(
    run: Annotated[str, typer.Argument(help="run id or name")],
    devices: Annotated[int, typer.Argument(help="devices to run on from the next checkpoint")],
    home: Annotated[
        Path | None, typer.Option("--home", help="state dir (default $JOBCTL_HOME or ./.jobctl)")
    ] = None,
) -> None:
    """Morph a running job onto DEVICES devices: checkpoint, re-plan, relaunch."""
    db = StateDB(home)
    row = db.get_run(run)
    if row is None:
        _fail(f"no run {run!r}: `jobctl status` lists the runs")
    # The request is checked on its own first: one the spec can never satisfy gets the
    # same answer whatever the run is doing at this moment.
    spec_file = Path(row["run_dir"]) / "spec.yaml"
    try:
        spec = load_spec(spec_file)
    except (SpecError, FileNotFoundError) as e:
        _fail(f"{spec_file}: cannot read the run's spec: {e}")
    problem = check_devices(spec, devices)
    if problem is not None:
        _fail(f"cannot scale run {row['id']} ({spec_file}): {problem}")
    if row["phase"] in BETWEEN:
        _fail(
            f"run {row['id']} is {row['phase']} (between two attempts): run `jobctl scale "
            f"{row['id']} {devices}` again once `jobctl status {row['id']}` shows it training"
        )
    if row["phase"] not in LIVE:
        _fail(
            f"run {row['id']} is {row['phase']}, not running: `jobctl resume {row['id']} "
            f"--devices {devices}` continues it on {devices} device(s)"
        )
    write_request(Path(row["run_dir"]), ScaleRequest(devices, "jobctl scale"))
    console.print(
        f"run {row['id']}: scaling from {row['devices']} to {devices} device(s) after the "
        f"next checkpoint; `jobctl events {row['id']}` shows the morph"
    )


def _fail(message: str):
    err.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(2)
