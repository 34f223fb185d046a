"""A plan's end-to-end prediction and where it comes from, in plain words."""

from __future__ import annotations

from rich.console import Console

from jobctl.engine.core.plan import Plan
from jobctl.engine.views.markup import styled


def duration(seconds: float) -> str:
    """Seconds as s, min or h."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def print_end_to_end(console: Console, plan: Plan, steps: int | None, done: int = 0) -> None:
    """Start-up plus the steps left after ``done`` (a resumed run's), and where the
    prediction comes from, in plain words: an analytic prediction on a CPU asks for
    ``jobctl calibrate``."""
    pr = plan.prediction
    if steps is not None:
        left = max(steps - done, 0)
        what = f"{left} steps" if not done else f"{left} steps left of {steps}"
        if pr.startup_s is None:
            start = "start-up not measured on this machine yet (the first run measures it)"
        else:
            start = f"start-up {pr.startup_s:.0f} s (measured by earlier runs here)"
        console.print(
            f"end to end: about {duration(pr.total_s(left))}: {start} + {what} x "
            f"{pr.step_time_s:.4g} s",
            soft_wrap=False,  # prose: wraps at words at 80 columns and in a pipe (#47)
            highlight=False,
        )
    if pr.source == "analytic":
        how = "from the hardware spec alone (no measured calibration)"
        hint = ""
        if plan.device == "cpu":
            hint = "; on a CPU such predictions are often several times optimistic"
        console.print(
            styled("[yellow]prediction source: analytic[/yellow], {}{}", how, hint),
            soft_wrap=False,
            highlight=False,
        )
        if hint:  # the command on a line of its own: what is copied is what runs
            console.print("  measure this machine: jobctl calibrate JOB.yaml", highlight=False)
    else:
        console.print(f"prediction source: measured calibration {pr.calibration}", highlight=False)
