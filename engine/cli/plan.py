"""Spec and plan commands: ``validate``, ``schema``, ``plan`` and ``render`` (nothing runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobctl.engine.cli.common import (
    BackendOpt,
    DevicesOpt,
    HomeOpt,
    SpecArg,
    cannot_plan,
    console,
    err,
    for_devices,
    load_or_exit,
    plan_or_exit,
    tuned_or_exit,
)
from jobctl.engine.views.markup import styled

if TYPE_CHECKING:  # the planner, the views and the backends load in the commands that use them
    from jobctl.engine.calibration.record import Calibration
    from jobctl.engine.core.plan import Plan
    from jobctl.engine.planner.objective import Choice
    from jobctl.spec import JobSpec


def validate(spec_file: SpecArg) -> None:
    """Check a job spec and print a one-line summary."""
    spec = load_or_exit(spec_file)
    summary = f"{spec_file}: job {spec.name!r}, {spec.training.steps} steps"
    console.print(styled("[green]ok[/green] {}", summary))


def schema(
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown",
            help="print the spec reference page instead (every field's type, default, "
            "description and example): jobctl schema --markdown > docs/spec.md",
        ),
    ] = False,
) -> None:
    """Print the job spec's JSON schema."""
    if markdown:
        from jobctl.spec.reference import render

        sys.stdout.write(render())  # print() would add a newline the page does not have
        return
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
    loaded = load_or_exit(spec_file)  # a bad spec fails before the planner (torch) loads
    from jobctl.engine.calibration.cache import calibration_for
    from jobctl.engine.planner.resolver import plan_priced

    spec = tuned_or_exit(loaded, spec_file, home, show=not as_json)
    planned = for_devices(spec, devices)  # once: it says so when it re-plans P x D
    try:  # the calibration builds (traces) the model: a TraceError is a ValueError too
        cal = calibration_for(planned, home)
        if _plan_mobius(spec_file, planned, devices, as_json, gantt, cal):
            return
        p, sim, choice = plan_priced(planned, devices, cal, home)
    except ValueError as e:  # PlanError, a model that cannot be traced, a bad schedule
        cannot_plan(spec_file, e)
    if _faster_mobius(planned, devices, p, as_json, gantt, cal):
        return
    if as_json:
        print(p.model_dump_json(indent=2))
    else:
        _print_plan(spec, p, choice, explain, home)
    _draw_step(spec, p, sim, gantt, as_json)


def _print_plan(spec: JobSpec, p: Plan, choice: Choice, explain: bool, home: Path | None) -> None:
    """The plan, its costs, the reasoning where ``--explain`` asks, the pruning."""
    from jobctl.engine.views import tables as views

    views.print_plan(console, p, spec.training.steps)
    _print_costs(spec, choice, p.prediction.startup_s is not None)
    if explain:
        views.print_explanation(console, p)
    if spec.pruning.enabled:
        _print_pruning(spec, p, explain, home)


def _draw_step(spec: JobSpec, p: Plan, sim, gantt: Path | None, as_json: bool) -> None:
    """The simulated step as a Gantt chart, where ``--gantt`` asks for one."""
    from jobctl.engine.views.gantt import draw_gantt

    if gantt is not None:
        title = f"{spec.name}: {p.summary()}, simulated {sim.step_time:.4g} s/step"
        _wrote(draw_gantt(sim, gantt, title), as_json)


def _wrote(path: Path, as_json: bool) -> None:
    (err if as_json else console).print(f"wrote {path}")


def _plan_mobius(
    spec_file: Path,
    spec: JobSpec,
    devices: int | None,
    as_json: bool,
    gantt: Path | None,
    cal: Calibration,
) -> bool:
    """A Mobius plan (forced, or auto where nothing else fits): the plan, why, its
    simulated step with the swaps; False where the search plans ``spec``."""
    if spec.parallelism.schedule not in ("mobius", "auto"):
        return False
    from jobctl.engine.mobius.planning.step import resolve_mobius

    try:
        G = devices if devices is not None else spec.hardware.devices
        got = resolve_mobius(spec, cal, G)
    except ValueError as e:  # PlanError
        cannot_plan(spec_file, e)
    if got is None:
        return False
    _show_mobius(spec, got, as_json, gantt)
    return True


def _faster_mobius(
    spec: JobSpec,
    devices: int | None,
    base: Plan,
    as_json: bool,
    gantt: Path | None,
    cal: Calibration,
) -> bool:
    """Auto's Mobius plan where it is simulated faster than ``base`` (the search's),
    shown as ``_plan_mobius`` shows one; False where ``base`` stands."""
    from jobctl.engine.mobius.planning.step import faster_mobius

    G = devices if devices is not None else spec.hardware.devices
    got = faster_mobius(spec, cal, G, base)
    if got is None:
        return False
    _show_mobius(spec, got, as_json, gantt)
    return True


def _show_mobius(spec: JobSpec, got, as_json: bool, gantt: Path | None) -> None:
    """Print a Mobius plan, why, its step's lanes; draw its Gantt where asked."""
    from jobctl.engine.views import tables as views
    from jobctl.engine.views.mobius_gantt import draw_mobius_gantt, gantt_lines

    p, sim, why = got
    if as_json:
        print(p.model_dump_json(indent=2))
    else:
        views.print_plan(console, p, spec.training.steps)
        console.print(why, soft_wrap=False, highlight=False)
        for line in gantt_lines(sim):
            console.print(line, soft_wrap=False, highlight=False)
        if spec.pruning.enabled:
            _print_pruning(spec, p, False, None)
    if gantt is not None:
        _wrote(
            draw_mobius_gantt(sim, gantt, f"{spec.name}: {why.removeprefix('mobius: ')}"), as_json
        )


def _print_costs(spec: JobSpec, choice: Choice, measured: bool) -> None:
    """Dollars to finish under each pricing, then the time-vs-dollars frontier; nothing
    for a pool with no price (every figure would read $0.0000)."""
    from jobctl.engine.planner.cost import pricings
    from jobctl.engine.planner.objective import frontier
    from jobctl.engine.views.cost import print_costs, print_frontier

    if not any(p.price_per_hour for p in pricings(spec)[0]):
        return
    print_costs(console, spec.training.steps, choice.pricings, pricings(spec)[1], measured)
    front = frontier(choice.options)
    rows = [(o.cand.layout.label(), o.forecast) for o in front]
    chosen = next((i for i, o in enumerate(front) if o is choice.chosen), None)
    print_frontier(console, rows, chosen, spec.planner.objective)


def _print_pruning(spec: JobSpec, p: Plan, explain: bool, home: Path | None) -> None:
    """The pruning schedule, then the predicted stage idle and what rebalancing recovers."""
    from jobctl.engine.pruning.preview import preview_pruning
    from jobctl.engine.rebalance.preview import preview_rebalancing
    from jobctl.engine.views.pruning import print_pruning
    from jobctl.engine.views.rebalance import print_rebalancing

    print_pruning(console, preview_pruning(spec), explain)
    why = None
    if p.mobius is not None:  # it runs (rebalance.swapped); the preview is resident
        why = "under schedule mobius (the preview simulates resident stages)"
    elif p.T > 1:  # it runs; the simulator prices the stages unsplit
        why = f"at tensor_parallel {p.T} (the preview simulates unsplit stages)"
    if why is not None:
        console.print(
            f"rebalancing preview: none {why}; the run rebalances by its measured per-block times",
            soft_wrap=False,  # prose: wraps at words at 80 columns and in a pipe (#47)
            highlight=False,
        )
        return
    print_rebalancing(console, preview_rebalancing(spec, p, home))


def _write_start(start: Path, backend: str, ctx) -> Path:
    """``start.sh``: starts the run's nodes as `jobctl apply` would, and waits."""
    from jobctl.backends import by_hand_command
    from jobctl.templates import render as render_template

    command = by_hand_command(backend, ctx)
    fields = {"run_id": ctx.run_id, "backend": backend, "run_dir": str(ctx.run_dir)}
    fields |= {"rdzv_endpoint": ctx.rdzv_endpoint, "python": ctx.python, "nnodes": ctx.nnodes}
    start.write_text(render_template("by-hand.sh.j2", **fields, command=command))
    start.chmod(0o755)
    return start


def render(
    spec_file: SpecArg,
    out: Annotated[Path, typer.Option("--out", help="output folder")],
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
    home: HomeOpt = None,
) -> None:
    """Write the launch scripts to a folder that runs as written, without running anything.

    OUT/run/ is the run's folder as `jobctl apply` lays it out (spec.yaml, plan.json,
    the backend's files in scripts/); OUT/start.sh starts the run by hand: the
    rendezvous host, then the nodes (local, ssh), sbatch or kubectl apply, and waits.
    """
    from jobctl.engine.cli.backend import render_or_exit
    from jobctl.engine.supervise.launch import new_run_id, run_context

    spec = load_or_exit(spec_file, backend=backend)
    p = plan_or_exit(spec, spec_file, devices, home)  # the calibration cached under home
    name = backend or spec.hardware.backend
    ctx = run_context(spec, p, new_run_id(spec.name), (out / "run").resolve())
    rendered = render_or_exit(err, spec_file, name, ctx)
    # The layout `jobctl apply` gives a run: its inputs in the run folder, the backend's
    # files in run/scripts/ (the sbatch script runs scripts/node-N.sh from run/).
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    for file, text in ctx.inputs.items():
        (ctx.run_dir / file).write_text(text)
    for path in rendered.write(ctx.run_dir / "scripts"):
        console.print(f"wrote {path}")
    start = _write_start(out / "start.sh", name, ctx)
    console.print(f"wrote {start}: `bash {start}` starts the run without jobctl")
