"""``jobctl calibrate``: measure the model and this machine, cache and print the record."""

from __future__ import annotations

from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, SpecArg, cannot_plan, console, err, load_or_exit
from jobctl.engine.core.home import HomeError, make_home
from jobctl.engine.views import tables as views
from jobctl.engine.views.markup import styled


def calibrate(
    spec_file: SpecArg,
    home: HomeOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=3, help="samples per value")] = 15,
) -> None:
    """Measure the model and this machine (Varuna Table 2) and cache the record.

    Per block (a traced model's: each subgraph, on a real batch): forward/backward time
    by micro-batch size, activation, parameter and peak bytes; point-to-point time by
    message size and allreduce time by ring size, in a small process group on this
    machine (and the tensor-parallel all-reduce of each admissible T). `jobctl plan`
    reuses the record for any G.
    """
    from jobctl.engine.calibration.cache import CalibrationError
    from jobctl.engine.calibration.measure.runner import calibrate as measure
    from jobctl.engine.model.graph.source import FixableError

    spec = load_or_exit(spec_file)
    try:
        # The record is cached under the home: a home that cannot be a folder is said
        # before a measurement of a minute whose result could not be kept (#46 item 12)
        make_home(home)
        with views.calibration_progress(console) as bar:
            task = bar.add_task("calibrating", total=1.0)

            def report(what: str, done: float) -> None:
                bar.update(task, completed=done, description=what)

            cal, path = measure(spec, home, repeats=repeats, progress=report)
    except (HomeError, CalibrationError) as e:
        err.print(styled("[red]error:[/red] {}", str(e)))
        raise typer.Exit(2) from None
    except FixableError as e:  # a model that cannot be built or traced, with its fix
        cannot_plan(spec_file, e, "calibrate")
    views.print_calibration(console, cal, path)
