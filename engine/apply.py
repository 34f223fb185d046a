"""``jobctl apply`` and ``jobctl resume``: plan, launch and supervise a run to its end.

A run continues from its newest complete checkpoint (local or remote) whenever it has
one, re-planned for the devices available now with the same global batch (Varuna's
job morphing): the new layout loads the layout-independent checkpoint and training
goes on from the exact next sample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from jobctl.backends import get_backend

from .checkpoint import read_meta
from .launch import Run, host_rendezvous, new_run_id, prepare_run
from .monitor import Monitor, Outcome, progress_bar, watch
from .plan import Plan
from .resume import ResumePoint, find_resume_point, local_root
from .state import StateDB


@dataclass
class ApplyOptions:
    """Knobs of one ``apply``."""

    backend: str | None = None
    resume_dir: Path | None = None
    deadline_s: float | None = None
    show_progress: bool = True
    run_id: str | None = None  # continue this existing run instead of creating one
    devices: int | None = None


def resume_point(spec, run_dir: Path, opts: ApplyOptions) -> ResumePoint | None:
    """Where the run continues from: an explicit folder, or its newest checkpoint."""
    if opts.resume_dir is not None:
        step = int(read_meta(opts.resume_dir)["step"])
        return ResumePoint(step, Path(opts.resume_dir).resolve(), "explicit")
    return find_resume_point(spec, local_root(spec, run_dir))


def launch(
    spec, plan: Plan, db: StateDB, spec_path: str | None, opts: ApplyOptions, console: Console
) -> tuple[Run, Outcome]:
    """Run ``plan`` for ``spec`` in the foreground; returns the run and how it ended."""
    backend_name = opts.backend or spec.hardware.backend
    backend = get_backend(backend_name)
    run_id = opts.run_id or new_run_id(spec.name)
    point = resume_point(spec, db.runs_dir / run_id, opts)
    env = {"JOBCTL_RESUME_DIR": str(point.path)} if point else {}
    existing = db.get_run(run_id)
    if existing is not None:  # resuming: the layout is planned anew for the devices now
        db.set_phase(run_id, "morphing", f"re-planned as {plan.summary()}")
    run = prepare_run(spec, plan, db, spec_path, backend_name, env, run_id)
    if point:
        db.add_event(
            run.id,
            "resume",
            f"from step {point.step} ({point.source}) as {plan.summary()}",
            {"step": point.step, "source": point.source, "path": str(point.path)},
        )
    db.set_phase(run.id, "launching", plan.summary())
    store = host_rendezvous(run.ctx.rdzv_endpoint)  # noqa: F841 - must live until the end
    handles = backend.submit(run.rendered, run.ctx)
    db.update_run(run.id, pids=",".join(map(str, handles)))
    db.set_phase(run.id, "training", f"pid {os.getpid()} supervising {len(handles)} node(s)")
    start = point.step if point else 0
    outcome = _supervise(run, backend, handles, db, spec.training.steps, start, opts, console)
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
    run: Run, backend, handles, db, total: int, start: int, opts: ApplyOptions, console: Console
) -> Outcome:
    if not opts.show_progress:
        return watch(Monitor(run, backend, handles, db, total), deadline=opts.deadline_s)
    with progress_bar(console) as bar:
        task = bar.add_task(run.id, total=total, completed=start, loss="-", sps="-")
        upload = bar.add_task("upload", total=1, completed=0, loss="", sps="-", visible=False)

        def on_event(rec: dict) -> None:
            if rec["kind"] == "step":
                bar.update(
                    task,
                    completed=rec["step"],
                    loss=f"{rec['loss']:.4f}",
                    sps=f"{rec['samples_per_s']:.1f}",
                )
            elif rec["kind"] == "upload":
                bar.update(
                    upload,
                    visible=True,
                    total=max(rec["bytes_total"], 1),
                    completed=rec["bytes_done"],
                    description=f"upload step {rec['step']}",
                )

        monitor = Monitor(run, backend, handles, db, total, on_event=on_event)
        return watch(monitor, deadline=opts.deadline_s)
