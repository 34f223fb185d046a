"""The ``jobctl`` command line.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec, plan or arguments: nothing
was started).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from jobctl.backends import BackendError
from jobctl.engine.cli.backend import exit_with, fail_launch, render_or_exit
from jobctl.engine.cli.common import HomeOpt, console, err
from jobctl.engine.cli.common import find_run as _find
from jobctl.engine.planner.resolver import PlanError, make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.views import tables as views
from jobctl.spec import SpecError, json_schema, load_spec

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

SpecArg = Annotated[Path, typer.Argument(help="job spec YAML file", show_default=False)]
DevicesOpt = Annotated[
    int | None, typer.Option("--devices", help="plan for N devices instead of the pool")
]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="override hardware.backend")]


def _load(path: Path, overrides: dict | None = None):
    try:
        return load_spec(path, overrides=overrides)
    except SpecError as e:
        err.print(f"[red]error:[/red] {path}: invalid job spec", highlight=False)
        err.print(str(e), highlight=False, markup=False)
        raise typer.Exit(2) from None
    except FileNotFoundError:
        err.print(f"[red]error:[/red] {path}: no such file")
        raise typer.Exit(2) from None


def _plan(spec, path: Path, devices: int | None):
    try:
        return make_plan(spec, devices)
    except (PlanError, ValueError) as e:
        err.print(f"[red]error:[/red] {path}: cannot plan: {e}", highlight=False)
        raise typer.Exit(2) from None


@app.command()
def validate(spec_file: SpecArg) -> None:
    """Check a job spec and print a one-line summary."""
    spec = _load(spec_file)
    console.print(f"[green]ok[/green] {spec_file}: job {spec.name!r}, {spec.training.steps} steps")


@app.command()
def schema() -> None:
    """Print the job spec's JSON schema."""
    print(json.dumps(json_schema(), indent=2))


@app.command()
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
    from jobctl.engine.views.gantt import draw_gantt

    spec = _load(spec_file)
    try:
        p, sim = plan_and_simulate(spec, devices, home=home)
    except ValueError as e:  # PlanError, or a schedule the generators reject
        err.print(f"[red]error:[/red] {spec_file}: cannot plan: {e}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(p.model_dump_json(indent=2))
    else:
        views.print_plan(console, p)
        if explain:
            views.print_explanation(console, p)
        if spec.pruning.enabled:
            from jobctl.engine.views.pruning import print_pruning

            print_pruning(console, spec, explain)
            from jobctl.engine.views.rebalance import print_rebalancing

            print_rebalancing(console, spec, p, home)
    if gantt is not None:
        title = f"{spec.name}: {p.summary()}, simulated {sim.step_time:.4g} s/step"
        path = draw_gantt(sim, gantt, title)
        (err if as_json else console).print(f"wrote {path}")


@app.command()
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

    spec = _load(spec_file)
    with views.calibration_progress(console) as bar:
        task = bar.add_task("calibrating", total=1.0)

        def report(what: str, done: float) -> None:
            bar.update(task, completed=done, description=what)

        cal, path = measure(spec, home, repeats=repeats, progress=report)
    views.print_calibration(console, cal, path)


@app.command()
def render(
    spec_file: SpecArg,
    out: Annotated[Path, typer.Option("--out", help="output folder")],
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Write the per-node launch scripts without running anything."""
    from jobctl.engine.supervise.launch import new_run_id, run_context

    spec = _load(spec_file)
    p = _plan(spec, spec_file, devices)
    run_id = new_run_id(spec.name)
    ctx = run_context(spec, p, run_id, (out / "run").resolve())
    rendered = render_or_exit(err, spec_file, backend or spec.hardware.backend, ctx)
    for path in rendered.write(out):
        console.print(f"wrote {path}")
    (out / "plan.json").write_text(p.model_dump_json(indent=2))


@app.command()
def apply(
    spec_file: SpecArg,
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
    home: HomeOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print plan and scripts, start nothing")
    ] = False,
    resume_dir: Annotated[
        Path | None, typer.Option("--resume-from", help="checkpoint folder to start from")
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="start a new run even if an unfinished one exists")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="supervise in the background and return at once")
    ] = False,
    run_id: Annotated[str | None, typer.Option("--run-id", hidden=True)] = None,
) -> None:
    """Validate, plan, render, launch and supervise a job until it ends.

    An unfinished earlier run of the same job is continued from its newest checkpoint.
    """
    from jobctl.engine.supervise.launch import run_context
    from jobctl.engine.supervise.service import ApplyOptions

    spec = _load(spec_file)
    p = _plan(spec, spec_file, devices)
    views.print_plan(console, p)
    if dry_run:
        ctx = run_context(spec, p, f"{spec.name}-dry-run", Path("<run-dir>"))
        rendered = render_or_exit(err, spec_file, backend or spec.hardware.backend, ctx)
        for name, text in rendered.files.items():
            console.rule(name)
            console.print(text, markup=False, highlight=False)
        return
    db = StateDB(home)
    previous = db.get_run(spec.name)
    if (
        run_id is None
        and previous
        and previous["phase"] != "completed"
        and not fresh
        and resume_dir is None
    ):
        run_id = previous["id"]
        console.print(f"continuing unfinished run {run_id} (use --fresh for a new run)")
    if detach:
        _detach(spec_file, spec.name, db, run_id, devices, backend, resume_dir)
        return
    opts = ApplyOptions(backend=backend, resume_dir=resume_dir, run_id=run_id)
    _launch_and_report(spec, p, db, str(spec_file.resolve()), opts)


def _detach(
    spec_file: Path, name: str, db: StateDB, run_id: str | None, devices, backend, resume_dir
) -> None:
    """Start this same `apply` as a background supervisor in its own session."""
    import subprocess

    from jobctl.engine.supervise.launch import new_run_id

    run_id = run_id or new_run_id(name)
    cmd = [
        sys.executable,
        "-m",
        "jobctl.engine.cli.app",
        "apply",
        str(spec_file.resolve()),
        "--home",
        str(db.home),
        "--run-id",
        run_id,
    ]
    for flag, value in (
        ("--devices", devices),
        ("--backend", backend),
        ("--resume-from", resume_dir),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    log = db.home / "supervisors" / f"{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    console.print(
        f"run {run_id} supervised in the background by pid {proc.pid} (log {log}); "
        f"`jobctl status {run_id}`, `jobctl logs {run_id} -f`, `jobctl stop {run_id}`"
    )


@app.command()
def resume(
    run: Annotated[str, typer.Argument(help="run id or name")],
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
    home: HomeOpt = None,
) -> None:
    """Continue a run: adopt its nodes if they still train (the supervisor died), else
    from its newest complete checkpoint, re-planned for the devices available now."""
    from jobctl.engine.supervise.service import ApplyOptions

    db = StateDB(home)
    row = _find(db, run)
    spec_file = Path(row["run_dir"]) / "spec.yaml"
    spec = _load(spec_file)
    p = _plan(spec, spec_file, devices)
    views.print_plan(console, p)
    opts = ApplyOptions(backend=backend, run_id=row["id"])
    _launch_and_report(spec, p, db, row["spec_path"], opts)


def _launch_and_report(spec, p, db: StateDB, spec_path: str | None, opts) -> None:
    from jobctl.engine.supervise.adoption import AdoptError
    from jobctl.engine.supervise.service import launch

    t0 = time.monotonic()
    try:
        run, outcome = launch(spec, p, db, spec_path, opts, console)
    except BackendError as e:
        fail_launch(db, spec.name, opts.run_id)
        exit_with(err, spec_path, opts.backend or spec.hardware.backend, "start", e)
    except AdoptError as e:  # another live process supervises the run: nothing started
        err.print(f"error: {e}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    if outcome.kind == "stopped":
        step = db.get_run(run.id)["step"]
        console.print(
            f"run {run.id} stopped at step {step} after a checkpoint; "
            f"`jobctl resume {run.id}` continues it"
        )
        return
    if not outcome.ok:
        err.print(f"[red]run {run.id} failed:[/red]")
        err.print(outcome.message, highlight=False, markup=False)
        raise typer.Exit(1)
    last = outcome.losses[-1] if outcome.losses else float("nan")
    console.print(
        f"[green]run {run.id} completed[/green] in {time.monotonic() - t0:.1f} s, "
        f"final loss {last:.4f}; checkpoints in {run.dir / 'checkpoints'}"
    )


# Fleets, schedules and the scheduler daemon live in their own modules (issue 7).
from jobctl.engine.cli.fleet import fleet_app  # noqa: E402
from jobctl.engine.cli.scale import scale  # noqa: E402
from jobctl.engine.cli.schedule import events, schedule_app, scheduler_app  # noqa: E402

app.add_typer(fleet_app, name="fleet")
app.add_typer(schedule_app, name="schedule")
app.add_typer(scheduler_app, name="scheduler")
app.command("events")(events)
app.command("scale")(scale)
from jobctl.engine.cli.report import report  # noqa: E402
from jobctl.engine.cli.runs import logs, status, stop  # noqa: E402

app.command("report")(report)
app.command("stop")(stop)
app.command("status")(status)
app.command("logs")(logs)


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
