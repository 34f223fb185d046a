"""``jobctl apply`` and ``jobctl resume``: plan, launch and supervise a run to its end.

A run continues from its newest complete checkpoint (local or remote) whenever it has
one, re-planned for the devices available now with the same global batch (Varuna's
job morphing): the new layout loads the layout-independent checkpoint and training
goes on from the exact next sample.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from jobctl.backends import get_backend

from .channel import SECRET_ENV
from .channel_adopt import adopt
from .channel_host import spawn_run_host, wait_run_host
from .checkpoint import read_meta
from .launch import Run, channel_env, new_run_id, prepare_run, read_metrics
from .monitor import Monitor, Outcome, progress_bar, watch
from .plan import Plan
from .resume import ResumePoint, find_resume_point, local_root
from .scaling import next_attempt
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
    """Run ``plan`` for ``spec`` in the foreground until it completes, fails or stops.

    With ``elasticity.enabled``, losing nodes (killed, or told to leave by SIGTERM after a
    checkpoint) morphs the run onto the devices left: re-plan with the same global
    batch, resume from the newest complete checkpoint, keep going. A scale request
    (``jobctl scale``, capacity returning) morphs it the same way (engine/scaling.py).
    """
    run_id = opts.run_id or new_run_id(spec.name)
    # A run whose supervisor died while its nodes kept training is adopted, not relaunched.
    adopted = adopt(spec, db, opts, console) if opts.run_id else None
    if adopted is not None:
        plan = adopted[0].plan
    lost_at: float | None = None
    while True:
        run, outcome = adopted or _attempt(spec, plan, db, spec_path, opts, run_id, console)
        adopted = None
        if lost_at is not None:
            _record_recovery(db, run, lost_at)
        backend = opts.backend or spec.hardware.backend
        next_plan = next_attempt(spec, plan, outcome, db, run_id, run.dir, backend)
        if next_plan is None:
            break
        lost_at = time.time() if outcome.kind == "preempted" else None
        plan, opts = next_plan, replace(opts, run_id=run_id, resume_dir=None)
    _finish(db, run.id, outcome)
    return run, outcome


def _record_recovery(db: StateDB, run: Run, since: float) -> None:
    """Recovery time: from losing a node to the first training step after the morph."""
    first = next(
        (
            e["ts"]
            for e in read_metrics(run.dir / "metrics.jsonl", 0)[0]
            if e["kind"] == "step" and e["ts"] > since
        ),
        None,
    )
    if first is not None:
        db.add_event(
            run.id,
            "recovery",
            f"training again {first - since:.1f} s after losing nodes",
            {"seconds": first - since},
        )


def _finish(db: StateDB, run_id: str, outcome: Outcome) -> None:
    # A preempted run that cannot morph is stopped, not failed: `jobctl resume` continues it.
    phase = {"completed": "completed", "failed": "failed"}.get(outcome.kind, "stopped")
    db.set_phase(
        run_id,
        phase,
        outcome.message.splitlines()[0],
        exit_code=outcome.exit_code,
        message=outcome.message,
    )


def _attempt(
    spec,
    plan: Plan,
    db: StateDB,
    spec_path: str | None,
    opts: ApplyOptions,
    run_id: str,
    console: Console,
) -> tuple[Run, Outcome]:
    """Launch one layout of the run and supervise it until it ends."""
    backend_name = opts.backend or spec.hardware.backend
    backend = get_backend(backend_name)
    point = resume_point(spec, db.runs_dir / run_id, opts)
    env = {"JOBCTL_RESUME_DIR": str(point.path)} if point else {}
    if db.get_run(run_id) is not None:  # resuming: the layout is planned anew for the devices now
        db.set_phase(run_id, "morphing", f"re-planned as {plan.summary()}")
    cenv, senv, cport = channel_env(spec.hardware.rendezvous_host)
    run = prepare_run(spec, plan, db, spec_path, backend_name, {**env, **cenv}, run_id, senv)
    if point:
        db.add_event(
            run.id,
            "resume",
            f"from step {point.step} ({point.source}) as {plan.summary()}",
            {"step": point.step, "source": point.source, "path": str(point.path)},
        )
    db.set_phase(run.id, "launching", plan.summary())
    # The rendezvous store and the event channel live in a detached run host, so the
    # workers keep training if this process dies (engine/channel_host.py).
    proc = spawn_run_host(run.dir, run.ctx.rdzv_endpoint, cport, senv.get(SECRET_ENV))
    try:
        handles = backend.submit(run.rendered, run.ctx)
    except BaseException:
        proc.kill()
        raise
    try:
        host = wait_run_host(run.dir, proc)
    except RuntimeError:
        backend.cancel(handles, 9)
        raise
    db.update_run(run.id, pids=",".join(map(str, handles)))
    db.set_phase(run.id, "training", f"pid {os.getpid()} supervising {len(handles)} node(s)")
    start = point.step if point else 0
    try:
        outcome = _supervise(run, backend, handles, db, spec, start, opts, console)
    finally:
        host.stop()
    if outcome.kind in ("preempted", "morph"):
        db.set_phase(run.id, "morphing", outcome.message)
    return run, outcome


def _supervise(
    run: Run, backend, handles, db, spec, start: int, opts: ApplyOptions, console: Console
) -> Outcome:
    total = spec.training.steps
    threshold = spec.elasticity.straggler_threshold
    hb = spec.elasticity.heartbeat_timeout_s
    if not opts.show_progress:
        monitor = Monitor(
            run, backend, handles, db, total, straggler_threshold=threshold, heartbeat_timeout_s=hb
        )
        return watch(monitor, deadline=opts.deadline_s)
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

        monitor = Monitor(run, backend, handles, db, total, on_event, threshold, hb)
        return watch(monitor, deadline=opts.deadline_s)
