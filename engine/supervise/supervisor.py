"""The supervisor: a run's life as an explicit state machine, one transition per step.

``Supervisor.step()`` performs exactly one phase transition or, while an attempt runs,
one poll of its Monitor, and returns the run's phase afterwards:

    pending -> calibrating -> planning -> launching -> training -> ... -> completed
    active (training, checkpointing, pruning, ...) -> morphing -> planning -> launching
    failed / stopped (a resume) -> calibrating -> planning -> launching -> ...

Between polls the workers' records move the run between the active phases (engine/
activity.py, engine/pruning/events.py). The first step attaches: it creates the run
(``pending``), or claims an existing one for this process (refused while another live
supervisor holds it) and adopts its nodes if they still train (the previous supervisor
died). A ``jobctl stop`` is a request in the state DB that the supervisor applies to
whatever nodes it has at that moment, or, between two attempts, by stopping there.

``run_to_end()`` is the loop ``jobctl apply`` runs: step, and sleep between polls. The
clock (for intervals), the sleep and the process launcher are injected, and the
StateDB carries the wall clock, so tests drive a run through its phases without
waiting or starting processes.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from jobctl.backends import Rendered
from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.calibration.startup import checkpoint_added_s, record_startup
from jobctl.engine.checkpoint.blocks import read_meta
from jobctl.engine.checkpoint.resume import ResumePoint, find_resume_point, local_root, none_usable
from jobctl.engine.core.env import CHANNEL_SECRET, RESUME_DIR
from jobctl.engine.core.phases import ACTIVE, STOPPABLE
from jobctl.engine.core.plan import Plan
from jobctl.engine.core.process import pid_alive, process_token
from jobctl.engine.planner.resolver import describe, machine_key, make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.activity import ActivityWatch
from jobctl.engine.supervise.adoption import (
    AdoptError,
    FinishedNodes,
    archive_offset,
    catch_up,
    finished_unsupervised,
    live_run,
)
from jobctl.engine.supervise.attempt import Attempt, ProcessLauncher, ProgressView, claim_host
from jobctl.engine.supervise.budget import BudgetWatch
from jobctl.engine.supervise.in_place import InPlaceSteps
from jobctl.engine.supervise.launch import (
    Run,
    channel_env,
    new_run_id,
    prepare_run,
    recorded_run,
    register_run,
    run_context,
)
from jobctl.engine.supervise.monitor import Monitor, Outcome
from jobctl.engine.supervise.recovery import NodeLoss, record_recovery
from jobctl.engine.supervise.scaling import next_attempt
from jobctl.spec import JobSpec

HANDOVER_POLL_S = 0.05  # the poll while survivors hand a step over (engine/worker/survival.py)
# A dead supervisor's attempt (one asked to stop too: resuming it is asking it to run).
ORPHANED = {p.value for p in ACTIVE} | {"launching", "stopping"}


#: what a run host that lost its port race says (errno 98, EADDRINUSE), and how many
#: times a launch picks new ports for it
PORT_TAKEN, PORT_RETRIES = "Address already in use", 3


class Supervisor(InPlaceSteps):
    """Walks one run through its phases; see the module docstring."""

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan | None,
        db: StateDB,
        spec_path: str | None,
        opts,
        console: Console,
        launcher=None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.spec, self.plan, self.db, self.spec_path = spec, plan, db, spec_path
        self.opts, self.console = opts, console
        self.launcher = launcher or ProcessLauncher()
        self.clock, self.sleep = clock, sleep
        self.run_id = opts.run_id or new_run_id(spec.name)
        self.backend = opts.backend or spec.hardware.backend
        self.resume_dir = opts.resume_dir  # the first attempt's only
        self.port_retries = 0  # launches again after a picked port was taken
        self.phase: str | None = None
        self.cal = None
        self.current: Run | None = None  # the latest attempt's run
        self.attempt: Attempt | None = None
        self.monitor: Monitor | None = None
        self.progress: ProgressView | None = None
        self.outcome: Outcome | None = None  # of the latest attempt
        self.loss: NodeLoss | None = None  # a loss whose recovery is not measured yet
        self.stop_seen: float | None = None
        self.watched_at = 0.0  # when the running attempt was first polled (deadline_s)
        self.launched_at: float | None = None  # this process launched the attempt (time)
        self.done = False
        self.reforming = None  # the survivors' answers due (InPlaceSteps)

    # -- the loop ------------------------------------------------------------------
    def run_to_end(self, interval: float = 0.25) -> tuple[Run, Outcome]:
        """Step until the run completes, fails or stops; sleep ``interval`` between polls."""
        try:
            while not self.done:
                self.step()
                if self.monitor is not None or self.reforming is not None:  # survivors wait:
                    self.sleep(HANDOVER_POLL_S if self._handing_over() else interval)
        except KeyboardInterrupt:  # a second Ctrl-C: leave the nodes running, adoptable
            self._detach()
            raise
        finally:
            if not self.done:  # interrupted: this process leaves the run
                self._close_attempt()
                self.db.release_supervisor(self.run_id, os.getpid())
        existing = self.current or recorded_run(
            self.spec, self.db, self.run_id, self.backend, self.plan, self.opts.devices
        )
        return existing, self.outcome

    def step(self) -> str:
        """One transition (or one poll of the running attempt); the phase afterwards."""
        if self.done:
            return self.phase
        if self.phase is None:
            return self._attach()
        self._apply_stop()
        if self.done:
            return self.phase
        if self.monitor is not None or self.reforming is not None:
            return self._poll()
        if self.attempt is not None:
            return self._start_training()
        act = {
            "pending": self._calibrate,
            "stopped": self._calibrate,
            "failed": self._calibrate,
            "calibrating": self._plan,
            "morphing": self._plan,
            "planning": self._launch,
        }.get(self.phase)
        if act is None:
            raise RuntimeError(f"run {self.run_id}: no step from phase {self.phase!r}")
        return act()

    # -- attaching -----------------------------------------------------------------
    def _attach(self) -> str:
        row = self.db.get_run(self.run_id) if self.opts.run_id else None
        if row is None:
            register_run(
                self.spec,
                self.db,
                self.spec_path,
                self.run_id,
                supervisor_pid=os.getpid(),
                supervisor_token=process_token(os.getpid()),
                backend=self.backend,
            )
            return self._refresh()
        self._claim()
        if row["phase"] == "completed":
            self.done, self.outcome = True, Outcome(True, 0, "already completed")
            return self._refresh()
        try:
            found = live_run(self.db, self.run_id)  # ends the rest of a broken attempt
        except AdoptError:
            self.db.release_supervisor(self.run_id, os.getpid())
            raise
        if found is not None:
            return self._adopt(*found)
        if row["phase"] in ORPHANED:
            return self._orphaned(row)
        return self._refresh()

    def _orphaned(self, row: dict) -> str:
        """A run whose supervisor and nodes are gone: what it wrote meanwhile is read
        first; it is complete if it checkpointed its last step, else relaunched."""
        row = catch_up(self.db, row)
        if not finished_unsupervised(row):
            self._transition("morphing", "supervisor and nodes gone: relaunching")
            return self._refresh()
        if row["phase"] == "launching":  # its records show it trained
            self._transition("training", "trained while no supervisor ran")
        losses = [] if row["loss"] is None else [row["loss"]]
        note = f"completed while no supervisor ran (step {row['step']}, its records read now)"
        return self._finish(Outcome(True, 0, note, losses))

    def _claim(self) -> None:
        me = os.getpid()
        other = self.db.claim_supervisor(self.run_id, me, pid_alive, process_token(me))
        if other is not None:
            raise AdoptError(
                f"run {self.run_id} is still supervised by pid {other}: `jobctl status "
                f"{self.run_id}` follows it, `jobctl stop {self.run_id}` stops it; resume "
                "it once that process has ended"
            )

    def _adopt(self, row, host, handles, backend) -> str:
        """Supervise the live nodes of a run whose supervisor died (engine/channel_adopt)."""
        run_dir = Path(row["run_dir"])
        self.plan = Plan.model_validate_json((run_dir / "plan.json").read_text())
        port = int(host.rdzv_endpoint.rsplit(":", 1)[1])
        ctx = run_context(self.spec, self.plan, self.run_id, run_dir, port=port)
        offset = archive_offset(run_dir / "metrics.jsonl", row["step"])
        run = Run(self.run_id, run_dir, ctx, Rendered(backend.name, {}), self.plan, offset)
        claim_host(run_dir)
        self.db.add_event(
            self.run_id,
            "adopt",
            f"pid {os.getpid()} adopted {len(handles)} live node(s) at step {row['step'] or 0}",
            {"handles": handles, "host_pid": host.pid, "offset": offset},
        )
        self.console.print(
            f"adopting live run {self.run_id}: {len(handles)} node(s) still training"
        )
        view = FinishedNodes(backend, run_dir, self.plan)
        self.current = run
        self.attempt = Attempt(run, view, handles, host=host, start_step=row["step"] or 0)
        self._watch()
        return self._refresh()

    # -- before an attempt ---------------------------------------------------------
    def _calibrate(self) -> str:
        self._transition("calibrating", "resolving the costs the plan is made with")
        self.cal = calibration_for(self.spec, self.db.home)
        self.db.add_event(
            self.run_id, "calibration", describe(self.cal, self.spec), {"source": self.cal.source}
        )
        return self.phase

    def _plan(self) -> str:
        if self.outcome is not None:  # after an attempt: the devices left, same global batch
            self._transition("planning", "re-planning for the devices available now")
            after = next_attempt(
                self.spec, self.plan, self.outcome, self.db, self.run_id, self.backend
            )
            if after is None:
                return self._finish(self.outcome)
            self.plan = after
        else:
            self._transition("planning", "resolving the parallel layout")
            if self.plan is None:
                cal = self.cal or calibration_for(self.spec, self.db.home)
                self.plan = make_plan(self.spec, self.opts.devices, cal, self.db.home)
        return self._note_plan()

    def _note_plan(self) -> str:
        self.db.add_event(
            self.run_id, "plan", self.plan.summary(), {"devices": self.plan.world_size}
        )
        self.db.update_run(self.run_id, devices=self.plan.world_size, plan=self.plan.summary())
        return self.phase

    def _launch(self) -> str:
        self._transition("launching", self.plan.summary())
        point = self._resume_point()
        unusable = None if point else none_usable(self.spec.checkpoint, self._ckpt_root())
        if unusable:  # checkpoints there, none loads: never silently from step 0
            return self._finish(Outcome(False, 1, unusable, kind="failed"))
        env = {RESUME_DIR: str(point.path)} if point else {}
        env |= self._in_place_env()  # survivors of a loss wait to re-form, where they can
        cenv, senv, cport = channel_env(self.spec.hardware.rendezvous_host)
        run = prepare_run(
            self.spec, self.plan, self.db, self.backend, self.run_id, {**env, **cenv}, senv
        )
        if point:
            self.db.add_event(
                self.run_id,
                "resume",
                f"from step {point.step} ({point.source}) as {self.plan.summary()}",
                {"step": point.step, "source": point.source, "path": str(point.path)},
            )
        self.current, self.resume_dir = run, None
        if self.loss is not None:  # steps lost: trained before the loss, not resumed from
            handed = ((self.outcome and self.outcome.handover) or {}).get("step")
            self.loss = self.loss.resumed_at(point.step if point else 0, handed)
        self.launched_at = time.time()  # the workers' clock: start-up to their first step
        self.attempt = self.launcher.start(run, self.backend, senv.get(CHANNEL_SECRET), cport)
        self.attempt.start_step = point.step if point else 0
        self.db.update_run(self.run_id, pids=",".join(map(str, self.attempt.handles)))
        return self.phase

    def _note_startup(self, first_step_ts: float | None) -> None:
        """Record this machine's start-up once per launched attempt: launch to the end of
        the first step, less the step itself (``calibration.startup``)."""
        if first_step_ts is None or self.launched_at is None:
            return
        step = self.plan.prediction.step_time_s if self.plan.prediction else 0.0
        seconds = first_step_ts - self.launched_at - step
        record_startup(self.db.home, machine_key(self.spec), seconds)
        self.launched_at = None

    def _resume_point(self) -> ResumePoint | None:
        """Where the attempt continues from: an explicit folder, or the newest checkpoint."""
        if self.resume_dir is not None:
            step = int(read_meta(self.resume_dir)["step"])
            return ResumePoint(step, Path(self.resume_dir).resolve(), "explicit")
        return find_resume_point(self.spec.checkpoint, self._ckpt_root())

    def _ckpt_root(self) -> Path:
        return local_root(self.spec.checkpoint, self.db.runs_dir / self.run_id)

    def _start_training(self) -> str:
        try:
            self.launcher.ready(self.attempt)  # its run host listens: the nodes can meet
        except RuntimeError as err:
            if PORT_TAKEN not in str(err) or self.port_retries >= PORT_RETRIES:
                raise
            return self._relaunch_on_new_ports()
        n = len(self.attempt.handles)
        self._transition("training", f"pid {os.getpid()} supervising {n} node(s)")
        self._watch()
        return self.phase

    def _relaunch_on_new_ports(self) -> str:
        """The run host could not bind a port picked free a moment before: another run
        starting on this machine took it meanwhile (a fleet's members launch at once).
        The nodes were ended; launch again on newly picked ports."""
        self.port_retries += 1
        note = (
            "a port picked for the run host was taken meanwhile: launching again on new "
            f"ports ({self.port_retries}/{PORT_RETRIES})"
        )
        self.db.add_event(self.run_id, "port_taken", note)
        self._close_attempt()
        return self._launch()

    def _watch(self) -> None:
        a, spec, el = self.attempt, self.spec, self.spec.elasticity
        total = spec.training.steps
        if self.opts.show_progress:
            self.progress = ProgressView(
                self.console, self.run_id, total, a.start_step, self.spec.training.log_every
            )
        activity = ActivityWatch(
            self.db, self.run_id, spec.checkpoint.interval, total, bool(spec.checkpoint.remote)
        )
        on_event = self.progress.on_event if self.progress else None
        self.watched_at = self.clock()
        self.budget = BudgetWatch(self.db, self.run_id, spec)
        self.monitor = Monitor(
            a.run,
            a.backend,
            a.handles,
            self.db,
            total,
            on_event,
            el.straggler_threshold,
            el.heartbeat_timeout_s,
            self.clock,
            activity,
        )
        self._watch_in_place(self.monitor)

    # -- while an attempt runs -----------------------------------------------------
    def _poll(self) -> str:
        if self.reforming is not None:
            return self._await_reform()
        self.budget.check()  # a stop request or a scale request, applied like the user's
        outcome = self.monitor.poll_once()
        first_step_ts = self.monitor.records.first_step_ts
        self._note_startup(first_step_ts)
        if self.loss is not None and first_step_ts is not None:
            seconds = record_recovery(self.db, self.run_id, self.loss, first_step_ts)
            record_startup(self.db.home, machine_key(self.spec), seconds, kind="recovery")
            self.loss = None
        deadline = self.opts.deadline_s
        if outcome is None and deadline is not None and self.clock() - self.watched_at > deadline:
            self.attempt.backend.cancel(self.attempt.handles, signal.SIGKILL)
            msg = f"timed out after {deadline:.0f} s"
            outcome = Outcome(False, 124, msg, self.monitor.records.losses, "failed")
        if outcome is None:
            return self._refresh()
        if outcome.kind not in ("preempted", "morph"):
            self._close_attempt()
            return self._finish(outcome)
        self.outcome = outcome
        if outcome.kind == "preempted":  # recovery is timed from the loss itself
            loss = outcome.loss or NodeLoss(self.db.clock(), outcome.lost_nodes, "detection")
            self.loss = loss.with_trained(self._trained(outcome))
        self._transition("morphing", outcome.message.splitlines()[0])
        if outcome.survivors_wait:
            return self._reform_in_place()
        self._close_attempt()
        return self.phase

    def _trained(self, outcome: Outcome) -> int:
        """The newest step trained before a loss, the survivors' handed-over one included."""
        handed = (outcome.handover or {}).get("step") or 0
        return max(self.db.get_run(self.run_id)["step"] or 0, handed)

    def _apply_stop(self) -> None:
        """A `jobctl stop` reaches the nodes running now, or ends the run between attempts."""
        asked = self.db.get_run(self.run_id)["stop_requested"]
        if asked is None or asked == self.stop_seen:
            return
        self.stop_seen = asked
        self._stop_in_place()  # nothing re-forms once a stop is asked
        if self.attempt is None:
            msg = "stopped on request between two attempts; `jobctl resume` continues it"
            self._finish(Outcome(False, 0, msg, kind="stopped"))
            return
        self.attempt.backend.cancel(self.attempt.handles, signal.SIGTERM)
        n = len(self.attempt.handles)
        note = f"SIGTERM sent to the {n} node(s) running now: checkpoint, then stop"
        # The request wrote the run's one "stop" event; this says how it reached the
        # nodes (both were "stop", so `status` listed the stop twice: #47).
        self.db.add_event(self.run_id, "stop_signal", note, {"handles": self.attempt.handles})
        # Ctrl-C on apply asks through the DB alone; `jobctl stop` has moved it already.
        self.db.set_phase_if(self.run_id, {p.value for p in STOPPABLE}, "stopping", note)

    def _record_checkpoint_costs(self, records) -> None:  # noqa: ANN001 - monitor.Records
        """This machine's checkpoint costs: the blocking copy's rate (GB/s), and where
        the run tells it, a whole checkpoint's seconds of training time with the bytes
        a rank copied (what the planner prices a checkpoint of about that size with)."""
        key = machine_key(self.spec)
        rate = statistics.median(records.snapshot_rates) / 1e9
        record_startup(self.db.home, key, rate, kind="snapshot")
        added = checkpoint_added_s(records.step_s, self.spec.checkpoint.interval)
        if added:  # None: too few periods; 0: no cost this run could see
            record_startup(self.db.home, key, added, kind="checkpoint")
            size = statistics.median(records.snapshot_sizes)
            record_startup(self.db.home, key, size, kind="checkpoint_bytes")

    def _detach(self) -> None:
        """Leave the run to its nodes and run host (which outlive this process): a
        `jobctl resume` adopts them, a `jobctl stop` stops them."""
        if self.progress is not None:
            self.progress.stop()
        if self.attempt is not None and not self.done:
            self.attempt = None  # its host stays up for the nodes
            note = f"supervisor (pid {os.getpid()}) detached on Ctrl-C; the nodes go on"
            self.db.add_event(self.run_id, "detach", note)

    def _close_attempt(self) -> None:
        if self.monitor is not None and self.monitor.records.snapshot_rates:
            self._record_checkpoint_costs(self.monitor.records)
        if self.progress is not None:
            self.progress.stop()
        if self.attempt is not None:
            self.attempt.stop_host()
        if self.loss is not None and self.monitor is not None:  # its survivors' last steps
            self.loss = self.loss.with_trained(self.monitor.trained_by_end())
        self.progress, self.monitor, self.attempt = None, None, None

    # -- bookkeeping ---------------------------------------------------------------
    def _finish(self, outcome: Outcome) -> str:
        # A preempted run that cannot morph is stopped, not failed: `jobctl resume` continues.
        phase = {"completed": "completed", "failed": "failed"}.get(outcome.kind, "stopped")
        first = outcome.message.splitlines()[0] if outcome.message else phase
        self._transition(phase, first, exit_code=outcome.exit_code, message=outcome.message)
        self.db.release_supervisor(self.run_id, os.getpid())
        self.outcome, self.done = outcome, True
        return self.phase

    def _transition(self, phase: str, note: str, **fields) -> None:
        self.db.set_phase(self.run_id, phase, note, **fields)
        self.phase = phase

    def _refresh(self) -> str:
        self.phase = self.db.get_run(self.run_id)["phase"]
        return self.phase
