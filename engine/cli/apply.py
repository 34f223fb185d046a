"""``jobctl apply`` and ``jobctl resume``: plan, launch and supervise a run to its end
(engine/supervise/service.py decides which run continues and runs it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from jobctl.engine.cli.common import (
    BackendOpt,
    DevicesOpt,
    HomeOpt,
    RunArg,
    SpecArg,
    console,
    err,
    find_run,
    load_or_exit,
    plan_or_exit,
    tuned_or_exit,
)
from jobctl.engine.core.home import require_run_id
from jobctl.engine.views.markup import styled

# The supervisor, the planner and the backends (torch, jinja2) load once the spec is
# read: a broken spec is refused in half a second, as `jobctl validate` refuses it.
if TYPE_CHECKING:
    from jobctl.engine.core.plan import Plan
    from jobctl.engine.state.db import StateDB
    from jobctl.engine.supervise.launch import Run
    from jobctl.engine.supervise.monitor import Outcome
    from jobctl.engine.supervise.service import ApplyOptions
    from jobctl.spec import JobSpec


def _checked_run_id(value: str | None) -> str | None:
    """``--run-id`` names a folder under the state home: refuse one that leaves it."""
    try:
        return value if value is None else require_run_id(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


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
    run_id: Annotated[
        str | None, typer.Option("--run-id", hidden=True, callback=_checked_run_id)
    ] = None,
) -> None:
    """Validate, plan, render, launch and supervise a job until it ends.

    An unfinished earlier run of the same job is continued from its newest checkpoint.
    """
    loaded = load_or_exit(spec_file, backend=backend)
    if dry_run:
        spec, p = _planned(loaded, spec_file, devices, home)
        _print_plan(spec, p)
        _print_dry_run(spec, p, spec_file, backend)
        return
    from jobctl.engine.state.db import StateDB
    from jobctl.engine.supervise.service import ApplyOptions

    db = StateDB(home)  # a damaged or locked DB is one line before any planning (#46 9)
    spec, p = _planned(loaded, spec_file, devices, home)
    run_id = _run_to_continue(db, spec.name, fresh, resume_dir, run_id)
    _print_plan(spec, p, _continued_from(db, run_id))
    opts = ApplyOptions(backend=backend, resume_dir=resume_dir, run_id=run_id)
    _start(spec_file, spec, p, db, devices, opts, detach)


def _start(spec_file, spec: JobSpec, p: Plan, db: StateDB, devices, opts, detach: bool) -> None:
    """Supervise the run here to its end, or (``--detach``) in the background."""
    if detach:
        _detach(spec_file, spec.name, db, devices, opts)
        return
    _launch_and_report(spec, p, db, str(spec_file.resolve()), opts)


def _planned(
    loaded: JobSpec, spec_file: Path, devices: int | None, home: Path | None
) -> tuple[JobSpec, Plan]:
    """The loaded spec, tuned, and its plan (a broken spec, or one this machine cannot
    run on the backend, exited at ``load_or_exit`` before the planner loaded)."""
    spec = tuned_or_exit(loaded, spec_file, home)
    return spec, plan_or_exit(spec, spec_file, devices, home)


def _print_plan(spec: JobSpec, p: Plan, done: int = 0) -> None:
    """The plan, its end-to-end prediction counting the steps after ``done``."""
    from jobctl.engine.views import tables as views

    views.print_plan(console, p, spec.training.steps, done)


def _continued_from(db: StateDB, run_id: str | None) -> int:
    """The step a continued run goes on from (its newest checkpoint), else 0."""
    row = db.get_run(run_id) if run_id else None
    return (row or {}).get("last_checkpoint") or 0


def _run_to_continue(
    db: StateDB, name: str, fresh: bool, resume_dir: Path | None, run_id: str | None
) -> str | None:
    """The run to go on with: ``run_id``, else the job's unfinished run (said; none
    with ``fresh``), else none (a new run)."""
    from jobctl.engine.supervise.service import unfinished_run

    if run_id is None and (run_id := unfinished_run(db, name, fresh, resume_dir)):
        console.print(f"continuing unfinished run {run_id} (use --fresh for a new run)")
    return run_id


def _print_dry_run(spec: JobSpec, p: Plan, spec_file: Path, backend: str | None) -> None:
    """Every file the backend would write for the run, printed instead of started."""
    from jobctl.engine.cli.backend import render_or_exit
    from jobctl.engine.supervise.launch import run_context

    ctx = run_context(spec, p, f"{spec.name}-dry-run", Path("<run-dir>"))
    rendered = render_or_exit(err, spec_file, backend or spec.hardware.backend, ctx)
    for name, text in rendered.files.items():
        console.rule(name)
        console.print(text, markup=False, highlight=False, soft_wrap=True)  # a file, as is


def _detach(
    spec_file: Path, name: str, db: StateDB, devices: int | None, opts: ApplyOptions
) -> None:
    """Start this same `apply` as a background supervisor in its own session."""
    import subprocess

    from jobctl.engine.recurring.procs import jobctl_argv
    from jobctl.engine.supervise.launch import new_run_id

    run_id = opts.run_id or new_run_id(name)
    cmd = jobctl_argv("apply", str(spec_file.resolve()), "--home", str(db.home), "--run-id", run_id)
    for flag, value in (
        ("--devices", devices),
        ("--backend", opts.backend),
        ("--resume-from", opts.resume_dir),
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
    _await_row(db, run_id, proc, log)
    console.print(
        f"run {run_id} supervised in the background by pid {proc.pid} (log {log}); "
        f"`jobctl status {run_id}`, `jobctl logs {run_id} -f`, `jobctl stop {run_id}`"
    )


def _await_row(db: StateDB, run_id: str, proc, log: Path, bound_s: float = 60.0) -> None:
    """Return once the background supervisor has recorded the run, so the id printed
    next works at once in `status` and `logs -f`; exit with its log if it ended first."""
    import time

    deadline = time.monotonic() + bound_s
    while db.get_run(run_id) is None and time.monotonic() < deadline:
        if proc.poll() is not None:
            why = _last_line(log)
            err.print(
                f"error: the background apply ended ({proc.returncode})"
                + (f": {why}" if why else "")
                + f"; its log: {log}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(proc.returncode or 1)
        time.sleep(0.1)


def _last_line(log: Path) -> str:
    """The last line a background apply wrote to ``log`` (its one-line error)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip().removeprefix("error: ") if lines else ""


def resume(
    run: RunArg,
    devices: DevicesOpt = None,
    backend: BackendOpt = None,
    home: HomeOpt = None,
) -> None:
    """Continue a run: adopt its nodes if they still train (the supervisor died), else
    from its newest complete checkpoint, re-planned for the devices available now."""
    from jobctl.engine.state.db import StateDB
    from jobctl.engine.supervise.service import ApplyOptions
    from jobctl.engine.views import tables as views

    db = StateDB(home)
    row = find_run(db, run)
    if row["phase"] == "completed":  # nothing to continue: say so before any planning
        loss = "-" if row["loss"] is None else f"{row['loss']:.4f}"
        console.print(
            f"run {row['id']} is already complete (step {row['step']}/{row['total_steps']}, "
            f"loss {loss}); `jobctl apply {row['spec_path'] or 'SPEC'} --fresh` starts a new run",
            highlight=False,
        )
        return
    spec_file = Path(row["run_dir"]) / "spec.yaml"
    spec = load_or_exit(spec_file, backend=backend)
    p = plan_or_exit(spec, spec_file, devices, home)
    # from its newest checkpoint (or the step its live nodes are at, a little further)
    views.print_plan(console, p, spec.training.steps, row["last_checkpoint"] or 0)
    opts = ApplyOptions(backend=backend, run_id=row["id"])
    _launch_and_report(spec, p, db, row["spec_path"], opts)


def _detached(db: StateDB, ref: str) -> None:
    """A second Ctrl-C: the supervisor has left the run to its nodes; say how to follow."""
    row = db.get_run(ref)
    rid = row["id"] if row else ref
    err.print(
        f"detached from run {rid}: its nodes go on without a supervisor. "
        f"`jobctl status {rid}` and `jobctl logs {rid} -f` follow it, `jobctl resume {rid}` "
        f"supervises it again, `jobctl stop {rid}` stops it",
        markup=False,
        highlight=False,
    )
    raise typer.Exit(130)


def _check_credentials(spec: JobSpec, spec_path: str | None) -> None:
    """Exit 2 with the fix, before any run is recorded or node started, when the run's
    object store needs credentials that are not there."""
    from jobctl.engine.supervise.service import credentials_problem

    problem = credentials_problem(spec)
    if problem is not None:
        err.print(
            f"error: {spec_path}: {problem}. Nothing was started.", highlight=False, markup=False
        )
        raise typer.Exit(2)


def _launch_and_report(
    spec: JobSpec, p: Plan, db: StateDB, spec_path: str | None, opts: ApplyOptions
) -> None:
    """Supervise the run in the foreground and say how it ended (exit 1 if it failed)."""
    from jobctl.backends import BackendError
    from jobctl.engine.cli.backend import exit_with
    from jobctl.engine.supervise.adoption import AdoptError
    from jobctl.engine.supervise.service import CtrlC, fail_refused, launch

    _check_credentials(spec, spec_path)
    t0 = time.monotonic()
    try:
        with CtrlC(db, opts.run_id or spec.name, console) as ctrl_c:
            run, outcome = launch(spec, p, db, spec_path, opts, console)
    except KeyboardInterrupt:
        _detached(db, opts.run_id or spec.name)
    except BackendError as e:
        fail_refused(db, spec.name, opts.run_id)
        exit_with(err, spec_path, opts.backend or spec.hardware.backend, "start", e)
    except AdoptError as e:  # another live process supervises the run: nothing started
        err.print(f"error: {e}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    except Exception as e:  # never leave a ghost run `launching` behind
        _launch_failed(db, spec.name, opts.run_id, e)
    _report(db, run, outcome, time.monotonic() - t0, ctrl_c.interrupted)


def _launch_failed(db: StateDB, name: str, run_id: str | None, e: Exception) -> NoReturn:
    """Say why the launch failed and exit: a DB that refused a write (locked, read-only,
    damaged: #46 item 12) is one line, exit 2; else the run is marked failed with its
    traceback in a file, exit 1 (or, where no run was recorded yet, says so)."""
    from jobctl.engine.state.reader import write_error
    from jobctl.engine.supervise.service import fail_launch

    refused = write_error(e)
    if refused is not None:
        err.print(f"error: {refused}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    where = fail_launch(db, name, run_id, e)
    err.print(f"error: the launch failed: {type(e).__name__}: {e}", highlight=False, markup=False)
    if where is None:
        err.print("no run is marked failed: none was recorded, or it had ended", markup=False)
    else:
        err.print(f"the run is marked failed; traceback in {where}", markup=False)
    raise typer.Exit(1) from None


def _report(db: StateDB, run: Run, outcome: Outcome, seconds: float, ctrl_c: bool) -> None:
    """Say how the run ended: exit 130 when a Ctrl-C stopped it, 1 when it failed."""
    if outcome.kind == "stopped":
        step = db.get_run(run.id)["step"]
        console.print(
            f"run {run.id} stopped at step {step} after a checkpoint; "
            f"`jobctl resume {run.id}` continues it"
        )
        if ctrl_c:
            raise typer.Exit(130)  # as a Ctrl-C'd command exits
        return
    if not outcome.ok:
        err.print(styled("[red]run {} failed:[/red]", run.id))
        err.print(outcome.message, highlight=False, markup=False)
        raise typer.Exit(1)
    last = outcome.losses[-1] if outcome.losses else float("nan")
    console.print(
        styled(
            "[green]run {} completed[/green] in {:.1f} s, final loss {:.4f}; checkpoints in {}",
            run.id,
            seconds,
            last,
            run.dir / "checkpoints",
        )
    )
