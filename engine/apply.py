"""``jobctl apply``: plan, render, launch and supervise one run to its end."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from jobctl.backends import get_backend

from .launch import Run, host_rendezvous, prepare_run
from .monitor import Monitor, Outcome, progress_bar, watch
from .plan import Plan
from .state import StateDB


@dataclass
class ApplyOptions:
    """Knobs of one ``apply``."""

    backend: str | None = None
    resume_dir: Path | None = None
    deadline_s: float | None = None
    show_progress: bool = True


def launch(
    spec, plan: Plan, db: StateDB, spec_path: str | None, opts: ApplyOptions, console: Console
) -> tuple[Run, Outcome]:
    """Run ``plan`` for ``spec`` in the foreground; returns the run and how it ended."""
    backend_name = opts.backend or spec.hardware.backend
    backend = get_backend(backend_name)
    env = {"JOBCTL_RESUME_DIR": str(opts.resume_dir)} if opts.resume_dir else {}
    run = prepare_run(spec, plan, db, spec_path, backend_name, env)
    db.set_phase(run.id, "launching", plan.summary())
    store = host_rendezvous(run.ctx.rdzv_endpoint)  # noqa: F841 - must live until the end
    handles = backend.submit(run.rendered, run.ctx)
    db.update_run(run.id, pids=",".join(map(str, handles)))
    db.set_phase(run.id, "training", f"pid {os.getpid()} supervising {len(handles)} node(s)")
    outcome = _supervise(run, backend, handles, db, spec.training.steps, opts, console)
    phase = "completed" if outcome.ok else "failed"
    db.set_phase(
        run.id,
        phase,
        outcome.message.splitlines()[0],
        exit_code=outcome.exit_code,
        message=outcome.message,
    )
    return run, outcome


def _supervise(
    run: Run, backend, handles, db, total: int, opts: ApplyOptions, console: Console
) -> Outcome:
    if not opts.show_progress:
        return watch(Monitor(run, backend, handles, db, total), deadline=opts.deadline_s)
    with progress_bar(console) as bar:
        task = bar.add_task(run.id, total=total, loss="-", sps="-")

        def on_step(rec: dict) -> None:
            bar.update(
                task,
                completed=rec["step"],
                loss=f"{rec['loss']:.4f}",
                sps=f"{rec['samples_per_s']:.1f}",
            )

        monitor = Monitor(run, backend, handles, db, total, on_step=on_step)
        return watch(monitor, deadline=opts.deadline_s)
