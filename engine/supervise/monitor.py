"""Watch a launched attempt: its nodes through the backend, and how it ended.

``Monitor.poll_once()`` does one round (read new metrics, check every node) and returns
how the attempt ended once it has; the supervisor (engine/supervise/supervisor.py) calls
it once per step in a steady phase. The worker records go to ``AttemptRecords``
(engine/supervise/records.py), whose state tells a stop from a loss. Its clock is
injected so tests drive time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobctl.backends import BackendError, NodeStatus
from jobctl.engine.channel.liveness import HeartbeatWatch
from jobctl.engine.core.event_schema import Bounds
from jobctl.engine.core.events import read_metrics
from jobctl.engine.core.phases import STOPPABLE
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.activity import ActivityWatch
from jobctl.engine.supervise.crash import bug_ranks, failure_log, lost_process_nodes
from jobctl.engine.supervise.handover import Handover
from jobctl.engine.supervise.in_place_watch import InPlaceWatch
from jobctl.engine.supervise.launch import Run, last_lines
from jobctl.engine.supervise.records import AttemptRecords
from jobctl.engine.supervise.recovery import NodeLoss
from jobctl.engine.supervise.scaling import ScaleRequest, ScaleWatch


@dataclass
class Outcome:
    """How an attempt ended: completed, stopped (checkpointed on request), preempted
    (nodes lost or told to leave; ``lost_nodes``, and ``loss``: when), or failed."""

    ok: bool
    exit_code: int
    message: str
    losses: list[float] = field(default_factory=list)
    kind: str = "completed"
    lost_nodes: list[int] = field(default_factory=list)
    devices: int | None = None  # a morph's target device count
    straggler_nodes: list[int] = field(default_factory=list)  # flagged when it ended
    loss: NodeLoss | None = None
    handover: dict | None = None  # lost nodes: the survivors' emergency step, or why none
    survivors_wait: bool = False  # the other nodes wait to re-form in place, holding:
    resume_step: int | None = None  # the step they continue from (handed over, or stopped at)


class Monitor(InPlaceWatch):
    """Follows one run's nodes and metrics until it ends."""

    def __init__(
        self,
        run: Run,
        backend,
        handles: list[int],
        db: StateDB,
        total_steps: int,
        on_event: Callable[[dict], None] | None = None,
        straggler_threshold: float = 0.15,
        heartbeat_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        activity: ActivityWatch | None = None,
    ):
        self.run, self.backend, self.handles, self.db = run, backend, handles, db
        self.clock, self.activity = clock, activity
        self.beats = HeartbeatWatch(heartbeat_timeout_s, clock)
        self.scaling = ScaleWatch(run.dir, db.clock)
        self.on_event = on_event
        watches = (self.beats, self.scaling)
        bounds = Bounds.of(run.plan, total_steps)
        self.records = AttemptRecords(
            db, run.id, total_steps, watches, straggler_threshold, clock, bounds
        )
        metrics = run.dir / "metrics.jsonl"
        self.offset = metrics.stat().st_size if metrics.exists() else 0  # earlier attempts
        if getattr(run, "metrics_offset", None) is not None:  # adopted: where the last one left
            self.offset = run.metrics_offset
        self.queued: str | None = None  # the scheduler's reason while a handle waits
        self.ran = False  # a handle was seen running in this attempt
        self.scale_to: ScaleRequest | None = None
        self.failed_at: float | None = None
        self.released: set[int] = set()  # nodes handed back to the backend
        self.released_handles: set[int] = set()  # handles that end on their own, exit 0
        self.left: set[int] = set()  # released handles seen ended
        self.handover: tuple[Handover, str] | None = None  # lost nodes, survivors writing
        self._init_in_place()

    STOP_EXIT_GRACE_S = 10.0  # agents may linger at torchrun's exit barrier
    # Every rank checkpointed and said so: what still runs is at most torchrun's exit
    # barrier, waiting for the agent of a node that left (a SIGTERM'd one) for minutes.
    ALL_STOPPED_GRACE_S = 2.0
    PEER_FAILURE_GRACE_S = 10.0  # for the node that lost a process to fail after its peers

    def poll_once(self) -> Outcome | None:
        """One round: returns the outcome once the attempt has ended, else None."""
        self._consume_metrics()
        self._release_freed()
        self._check_scale()
        outcome = self._poll() if self.handover is None else self._handed_over()
        if outcome is None:
            return None
        if self.scale_to is not None and outcome.kind == "stopped":
            req = self.scale_to
            msg = f"{req.reason}: morphing to {req.devices} device(s) after a checkpoint"
            outcome = Outcome(False, 0, msg, self.records.losses, "morph", devices=req.devices)
        outcome.straggler_nodes = self.records.detector.nodes(self.records.stragglers)
        if outcome.kind == "preempted" and outcome.loss is None:
            # Records the host appended while the attempt ended still count: the newest
            # step trained before the loss decides how many steps are trained again.
            self._consume_metrics()
            outcome.loss = self.records.lost.loss(outcome.lost_nodes)
        return outcome

    def trained_by_end(self) -> int:
        """The newest step any rank completed in this attempt, read once its host has
        stopped: a survivor's last heartbeats can land after the attempt was judged
        ended (the lost node's own records of those steps died with it)."""
        self._consume_metrics()
        return self.records.lost.newest

    def _conclude(
        self, kind: str, code: int, message: str, lost: list[int] | None = None
    ) -> Outcome:
        """How the attempt ended, with its losses (only a completed attempt is ok)."""
        return Outcome(kind == "completed", code, message, self.records.losses, kind, lost or [])

    def _check_scale(self) -> None:
        """A due scale request stops every rank gracefully (checkpoint, then exit)."""
        r = self.records
        if self.scale_to is not None or r.stopped_at is not None or r.finished:
            return
        req = self.scaling.due()
        if req is not None:
            self.scale_to = req
            self.db.add_event(self.run.id, "scale", f"{req.reason}: to {req.devices} device(s)")
            self.backend.cancel(self.handles, signal.SIGTERM)

    def _release_freed(self) -> None:
        """Nodes packing freed go back to the backend once every rank on them has left
        (each wrote ``freed`` with the node script it ran under): their processes end on
        their own, which is expected."""
        self._release_at_end()
        if not self.records.freed_ranks:
            return
        per_node = self.run.ctx.nproc_per_node
        left: dict[int, int] = {}
        for node in self.records.freed_ranks.values():
            left[node] = left.get(node, 0) + 1
        done = sorted(
            n
            for n, count in left.items()
            if n not in self.released and n < len(per_node) and count >= per_node[n]
        )
        if done:
            self._release(done, "freed by packing")

    def _release(self, nodes: list[int], why: str) -> None:
        """Hand ``nodes`` back to the backend: their agents end, their exit is expected."""
        self.released |= set(nodes)
        try:
            got = self.backend.release(self.handles, nodes)
        except (BackendError, OSError) as e:
            msg = f"node(s) {nodes} could not be released ({why}): {e}"
            self.db.add_event(self.run.id, "release_error", msg, {"nodes": nodes})
            return
        self.released_handles |= set(got.handles)
        msg = f"released node(s) {nodes} {why}: {got.note}"
        self.db.add_event(self.run.id, "released", msg, {"nodes": nodes, "note": got.note})

    def _read_statuses(self) -> list[NodeStatus]:
        """The backend's view of every handle; a released node's end is expected (exit 0)."""
        statuses = self.backend.status(self.handles)
        for n in self.released_handles:
            if statuses[n].done:
                if n not in self.left:
                    self.left.add(n)
                    msg = f"node {n} left after its release ({statuses[n].detail})"
                    self.db.add_event(self.run.id, "node_left", msg, {"node": n})
                statuses[n] = NodeStatus("succeeded", 0, statuses[n].detail)
        return statuses

    def _poll(self) -> Outcome | None:
        statuses = self._read_statuses()
        codes = [s.exit_code for s in statuses]
        self._follow_queue(statuses)
        r = self.records
        if r.stopped_at is not None:
            return self._stopped(statuses)
        if r.finished and all(c is not None for c in codes):
            # Every step trained and the final checkpoint is on disk: however the agents
            # left (a late SIGTERM, say), nothing is missing.
            return self._conclude("completed", 0, "completed")
        if silent := self._check_heartbeats(codes):
            return silent
        gone = [n for n, s in enumerate(statuses) if s.phase == "stopped"]
        if gone:  # ended from outside: cancelled, out of time, preempted or lost
            self._consume_metrics()  # its last records (stopped?) may have come meanwhile
            if r.stopped_at is not None:
                return self._stopped(statuses)
            ended = self._ended_outside(statuses, gone)
            if ended.kind == "preempted":
                return self._lose(ended.lost_nodes, ended.message)
            self.backend.cancel(self.handles, 9)
            return ended
        failed = [c for c in codes if c not in (None, 0)]
        if failed and r.node_sigterm and not r.trained:
            # Told to stop while torchrun was still starting: no step trained, none lost.
            self.backend.cancel(self.handles, 9)
            return self._conclude("stopped", 0, "stopped before the first step")
        if failed:
            return self._failed(codes)
        if all(c == 0 for c in codes):
            self._consume_metrics()
            return self._conclude("completed", 0, "completed")
        return None

    def _check_heartbeats(self, codes: list[int | None]) -> Outcome | None:
        """Processes still there, heartbeats gone: a lost or hung machine (not one told
        to stop, waiting in a queue, or packed away)."""
        r = self.records
        if r.sigterm_nodes or r.finished or self.queued is not None:
            return None
        silent = [n for n in self.beats.silent(codes) if n not in r.rebalance.freed_nodes]
        if not silent:
            return None
        msg = f"no heartbeat from node(s) {silent} for {self.beats.timeout_s:.0f} s"
        self.db.add_event(self.run.id, "heartbeat_timeout", msg, {"nodes": silent})
        return self._lose(silent, msg)

    def _lose(self, lost: list[int], msg: str) -> Outcome | None:
        """Nodes are lost: end what is left of them at once, and the rest once their
        survivors have handed the step they hold over (engine/supervise/handover.py)."""
        own = len(self.handles) == self.run.ctx.nnodes  # a handle per node: end only those
        self.backend.cancel([self.handles[n] for n in lost] if own else self.handles, 9)
        plan = getattr(self.run, "plan", None)
        if own and plan is not None:
            gone = set(self.records.freed_ranks)
            self.handover = (Handover(self.run, lost, gone, self.clock, self.epoch), msg)
            return self._handed_over()
        return self._conclude("preempted", 1, msg, lost)

    def _handed_over(self) -> Outcome | None:
        """The attempt's end once the survivors answered (or their time is up)."""
        handover, msg = self.handover
        if not handover.settled():
            return None
        self._consume_metrics()  # their last records (the handed-over step's) first
        out = self._conclude("preempted", 1, msg, handover.lost)
        out.handover = handover.record(self.db)
        # Kept to re-form in place: every survivor handed over, none packed away.
        keep = self.keep_survivors and not self.records.freed_ranks
        out.survivors_wait = keep and out.handover["step"] is not None
        out.resume_step = out.handover["step"]
        if not out.survivors_wait:
            self.backend.cancel(self.handles, 9)
        return out

    def _nodes(self, handle_index: int) -> list[int]:
        """The run's nodes behind one handle (one batch job may hold them all)."""
        nnodes = self.run.ctx.nnodes
        return list(range(nnodes)) if len(self.handles) < nnodes else [handle_index]

    def _ended_outside(self, statuses: list[NodeStatus], gone: list[int]) -> Outcome:
        """Classify a stop from the backend's own view (Slurm's CANCELLED, TIMEOUT,
        PREEMPTED, NODE_FAIL; a local process tree that vanished)."""
        causes = {statuses[n].cause for n in gone}
        what = ", ".join(sorted({statuses[n].detail for n in gone}))
        if "cancelled" in causes:
            return self._conclude("stopped", 0, f"cancelled ({what})")
        if causes == {"timeout"}:
            if self.records.checkpointed or not self.records.trained:
                return self._conclude("stopped", 0, f"time limit reached ({what})")
            return self._conclude(
                "failed",
                1,
                f"time limit reached ({what}) before any checkpoint of this attempt: raise "
                "hardware.slurm.time_limit_minutes, or set hardware.slurm.signal_before_s "
                "so the ranks checkpoint before the limit",
            )
        lost = sorted({k for n in gone for k in self._nodes(n)})
        return self._conclude("preempted", 1, f"lost node(s) {lost} ({what})", lost)

    def _follow_queue(self, statuses: list[NodeStatus]) -> None:
        """A handle waiting in its scheduler's queue (submitted, or requeued after a
        preemption) shows as launching with the scheduler's reason, not as a hung run."""
        pending = [s.detail for s in statuses if s.phase == "pending"]
        rid = self.run.id
        if pending and self.ran:
            # It ran and waits again: requeued by its scheduler (preemption with requeue,
            # a node failure, `scontrol requeue`), gracefully stopped or not.
            self._requeued(pending[0])
        self.ran = self.ran or any(s.phase == "running" for s in statuses)
        if pending and pending[0] != self.queued:
            self.queued = pending[0]
            note = f"queued: {self.queued}"
            if self.db.get_run(rid)["phase"] == "launching":
                self.db.update_run(rid, message=note)
                self.db.add_event(rid, "queued", note)
            else:
                self.db.set_phase(rid, "launching", note, message=note)
        elif not pending and self.queued is not None:
            self.queued = None
            self.beats.last.clear()  # watched again from each node's first heartbeat
            # A run asked to stop meanwhile stays stopping (its nodes were signalled).
            live = {p.value for p in STOPPABLE}
            self.db.set_phase_if(rid, live, "training", "running", message=None)

    def _requeued(self, detail: str) -> None:
        """The same batch job runs again and resumes from the newest checkpoint (the
        node scripts find it): the old attempt's last records are read, then this
        monitor follows a fresh attempt."""
        self._consume_metrics()
        self.records.restart()
        self.ran = False
        self.db.add_event(self.run.id, "requeue", f"requeued: {detail}")

    def _stopped(self, statuses: list[NodeStatus]) -> Outcome | None:
        """Every rank checkpointed and is leaving; some or all nodes were told to stop."""
        pending = [s.detail for s in statuses if s.phase == "pending"]
        if pending:  # requeued (see ``_follow_queue``) before this monitor saw it run
            self._requeued(pending[0])
            return None
        r = self.records
        if self._noticed_some(statuses):
            return self._survivors_of_notice(statuses)
        if any(not s.done for s in statuses):
            # (Only where jobctl runs the node processes itself: a batch system may be
            # requeueing the job, and cancelling it now would end it for good.)
            live = self.run.plan.world_size - len(r.freed_ranks)
            everyone = len(r.stopped_ranks) >= live and (self.backend.name in ("local", "ssh"))
            grace = self.ALL_STOPPED_GRACE_S if everyone else self.STOP_EXIT_GRACE_S
            if self.clock() - r.stopped_at < grace:
                return None
            self.backend.cancel(self.handles, 9)
        nodes = set(range(self.run.ctx.nnodes))
        if r.sigterm_nodes >= nodes or not r.sigterm_nodes:
            return self._conclude("stopped", 0, "stopped after a checkpoint")
        lost = sorted(r.sigterm_nodes)
        return self._conclude("preempted", 0, f"node(s) {lost} preempted after a checkpoint", lost)

    def _consume_metrics(self) -> None:
        recs, self.offset = read_metrics(self.run.dir / "metrics.jsonl", self.offset)
        for rec in self._this_epoch(recs):
            if not self.records.record(rec):
                continue  # malformed: counted and logged, never fatal
            if self.activity is not None:  # after pruning and rebalancing had their say
                self.activity.record(rec)
            if self.on_event:
                self.on_event(rec)

    def _failed(self, codes: list[int | None]) -> Outcome | None:
        """Nodes failed: a bug in the code fails the run; a worker process that died
        without an error report (killed) loses its node, as a preemption does
        (engine/supervise/crash.py). The node that lost the process may fail a little after the
        peers it took down: they get a grace period to show which one it was."""
        code = next(c for c in codes if c not in (None, 0))
        if bug_ranks(self.run.dir):
            return self._fail(code)
        failed = {k for n, c in enumerate(codes) if c not in (None, 0) for k in self._nodes(n)}
        plan = getattr(self.run, "plan", None)
        ranks = {r.rank: r.node for r in plan.ranks} if plan is not None else {}
        lost = lost_process_nodes(self.run.dir, ranks, failed, self.records.started)
        if not lost:
            self.failed_at = self.failed_at if self.failed_at is not None else self.clock()
            running = any(c is None for c in codes)
            if running and self.clock() - self.failed_at < self.PEER_FAILURE_GRACE_S:
                return None
            return self._fail(code)
        msg = f"node(s) {lost} lost a worker process without an error report (killed)"
        self.db.add_event(self.run.id, "process_lost", msg, {"nodes": lost})
        return self._lose(lost, msg)

    def _fail(self, code: int) -> Outcome:
        self.backend.cancel(self.handles, 9)
        rank, log, note = failure_log(self.backend, self.handles, self.run.dir)
        where = f"rank {rank}" if rank is not None else "a node"
        tail = "\n".join(last_lines(log)) if log else ""
        msg = f"{where} failed (exit {code}); last lines of {log}{note}:\n{tail}"
        return self._conclude("failed", code or 1, msg)
