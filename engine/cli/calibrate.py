"""``jobctl calibrate``: measure the model and this machine, cache and print the record."""

from __future__ import annotations

from typing import Annotated

import typer

from jobctl.engine.cli.common import HomeOpt, SpecArg, console, load_or_exit
from jobctl.engine.views import tables as views


def calibrate(
    spec_file: SpecArg,
    home: HomeOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=3, help="samples per value")] = 15,
) -> None:
    """Measure the model and this machine (Varuna Table 2) and cache the record.

    Per block: forward/backward time by micro-batch size, activation, parameter and peak
    bytes; point-to-point time by message size and allreduce time by ring size, in a
    small process group on this machine. `jobctl plan` reuses the record for any G.
    """
    from jobctl.engine.calibration.measure.runner import calibrate as measure

    spec = load_or_exit(spec_file)
    if _traced(spec):
        console.print(
            f"[red]error[/red]: {spec_file}: jobctl calibrate measures the builtin GPT and "
            "hand-cut blocks; this model is traced (model.huggingface, or a model.import "
            "factory returning one nn.Module), and `jobctl plan` prices its subgraphs from "
            "their real shapes (FLOPs counted on the meta device) with the device facts of "
            "the hardware section\n  fix: run `jobctl plan` / `jobctl apply` without "
            "calibrating (the prediction says its source is analytic)",
            soft_wrap=True,
        )
        raise typer.Exit(2)
    with views.calibration_progress(console) as bar:
        task = bar.add_task("calibrating", total=1.0)

        def report(what: str, done: float) -> None:
            bar.update(task, completed=done, description=what)

        cal, path = measure(spec, home, repeats=repeats, progress=report)
    views.print_calibration(console, cal, path)


def _traced(spec) -> bool:
    """Whether the spec's model is traced into subgraphs (not measurable block by block)."""
    m = spec.model
    if m.huggingface is not None:
        return True
    if not m.import_:
        return False
    from jobctl.engine.model.blocks import returns_list

    return not returns_list(m.import_, dict(m.import_args))
