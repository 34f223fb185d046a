"""Spec and plan commands: ``validate``, ``schema``, ``plan`` and ``render`` (nothing runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from jobctl.engine.cli.common import (
    BackendOpt,
    DevicesOpt,
    HomeOpt,
    SpecArg,
    console,
    err,
    for_devices,
    load_or_exit,
    plan_or_exit,
)

if TYPE_CHECKING:  # the planner, the views and the backends load in the commands that use them
    from jobctl.engine.core.plan import Plan
    from jobctl.spec import JobSpec


def validate(spec_file: SpecArg) -> None:
    """Check a job spec and print a one-line summary."""
    spec = load_or_exit(spec_file)
    summary = f"{spec_file}: job {spec.name!r}, {spec.training.steps} steps"
    console.print(f"[green]ok[/green] {escape(summary)}")


def schema() -> None:
    """Print the job spec's JSON schema."""
    from jobctl.spec import json_schema

    print(json.dumps(json_schema(), indent=2))


def plan(
    spec_file: SpecArg,
    devices: DevicesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="print the reasoning: m by F(m)/m, the P sweep")
    ] = False,
    gantt: Annotated[
        Path | None, typer.Option("--gantt", help="draw the simulated step to this PNG file")
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Resolve and print the parallel plan (P, D, micro-batching, stages, ranks, schedule).

    Uses the cached calibration of this model and machine (`jobctl calibrate`) if one
    matches, else costs derived from the hardware spec; the plan says which.
    """
    from jobctl.engine.planner.resolver import plan_and_simulate
    from jobctl.engine.views import tables as views
    from jobctl.engine.views.gantt import draw_gantt

    spec = load_or_exit(spec_file)
    try:
        p, sim = plan_and_simulate(for_devices(spec, devices), devices, home=home)
    except ValueError as e:  # PlanError, or a schedule the generators reject
        err.print(f"[red]error:[/red] {escape(f'{spec_file}: cannot plan: {e}')}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(p.model_dump_json(indent=2))
    else:
        views.print_plan(console, p, spec.training.steps)
        if explain:
            views.print_explanation(console, p)
        if spec.pruning.enabled:
            _print_pruning(spec, p, explain, home)
    if gantt is not None:
        title = f"{spec.name}: {p.summary()}, simulated {sim.step_time:.4g} s/step"
        path = draw_gantt(sim, gantt, title)
        (err if as_json else console).print(f"wrote {path}")


def _print_pruning(spec: JobSpec, p: Plan, explain: bool, home: Path | None) -> None:
    """The pruning schedule, then the predicted stage idle and what rebalancing recovers."""
    from jobctl.engine.pruning.preview import preview_pruning
    from jobctl.engine.rebalance.preview import preview_rebalancing
    from jobctl.engine.views.pruning import print_pruning
    from jobctl.engine.views.rebalance import print_rebalancing

    print_pruning(console, preview_pruning(spec), explain)
    print_rebalancing(console, preview_rebalancing(spec, p, home))


def render(
    spec_file: SpecArg,
    out: Annotated[Path, typer.Option("--out", help="output folder")],
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Write the launch scripts to a folder that runs as written, without running anything.

    The folder holds the scripts, the spec, plan.json and run/ (where the run writes);
    its README says how to start it by hand.
    """
    from jobctl.engine.cli.backend import render_or_exit
    from jobctl.engine.supervise.launch import new_run_id, run_context

    spec = load_or_exit(spec_file)
    p = plan_or_exit(spec, spec_file, devices)
    run_id = new_run_id(spec.name)
    ctx = run_context(spec, p, run_id, (out / "run").resolve())
    rendered = render_or_exit(err, spec_file, backend or spec.hardware.backend, ctx)
    for path in rendered.write(out):
        console.print(f"wrote {path}")
    (out / "plan.json").write_text(p.model_dump_json(indent=2))
