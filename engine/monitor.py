"""Watch a launched run: metrics into the state DB and a progress bar, failures out.

``Monitor.poll_once()`` does one round (read new metrics, check every node); the loop
around it takes an injectable ``sleep`` so tests can drive it without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .channel_liveness import HeartbeatWatch
from .launch import Run, failing_rank, last_lines, read_metrics
from .pruning_events import PruningWatch
from .rebalance_events import KINDS as REBALANCE_KINDS
from .rebalance_events import RebalanceWatch
from .state import StateDB
from .stragglers import StragglerDetector


@dataclass
class Outcome:
    """How an attempt ended: completed, stopped (checkpointed on request), preempted
    (nodes lost or told to leave; ``lost_nodes``), or failed."""

    ok: bool
    exit_code: int
    message: str
    losses: list[float] = field(default_factory=list)
    kind: str = "completed"
    lost_nodes: list[int] = field(default_factory=list)


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[sps]} samples/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


class Monitor:
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
    ):
        self.run, self.backend, self.handles, self.db = run, backend, handles, db
        self.beats = HeartbeatWatch(heartbeat_timeout_s, clock)
        self.total = total_steps
        self.on_event = on_event
        metrics = run.dir / "metrics.jsonl"
        self.offset = metrics.stat().st_size if metrics.exists() else 0  # earlier attempts
        if getattr(run, "metrics_offset", None) is not None:  # adopted: where the last one left
            self.offset = run.metrics_offset
        self.losses: list[float] = []
        self.last_upload = -1
        self.sigterm_nodes: set[int] = set()
        self.stopped_at: float | None = None
        self.finished = False
        self.detector = StragglerDetector(threshold=straggler_threshold)
        self.stragglers: list[int] = []
        self.pruning = PruningWatch(db, run.id)
        self.rebalance = RebalanceWatch(db, run.id)

    STOP_EXIT_GRACE_S = 10.0  # agents may linger at torchrun's exit barrier

    def poll_once(self) -> Outcome | None:
        """One round: returns the outcome once the attempt has ended, else None."""
        self._consume_metrics()
        codes = self.backend.poll(self.handles)
        if self.stopped_at is not None:
            return self._stopped(codes)
        if self.finished and all(c is not None for c in codes):
            # Every step trained and the final checkpoint is on disk: however the agents
            # left (a late SIGTERM, say), nothing is missing.
            return Outcome(True, 0, "completed", self.losses)
        silent = [] if self.sigterm_nodes or self.finished else self.beats.silent(codes)
        silent = [n for n in silent if n not in self.rebalance.freed_nodes]  # packed away
        if silent:  # processes still there, heartbeats gone: a lost or hung machine
            self.backend.cancel(self.handles, 9)
            t = self.beats.timeout_s
            msg = f"no heartbeat from node(s) {silent} for {t:.0f} s"
            self.db.add_event(self.run.id, "heartbeat_timeout", msg, {"nodes": silent})
            return Outcome(False, 1, msg, self.losses, "preempted", silent)
        killed = [n for n, c in enumerate(codes) if c is not None and c < 0]
        if killed:  # a node's process tree vanished: preemption, not a bug
            self.backend.cancel(self.handles, 9)
            return Outcome(False, 1, f"lost node(s) {killed}", self.losses, "preempted", killed)
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return self._fail(failed[0])
        if all(c == 0 for c in codes):
            self._consume_metrics()
            return Outcome(True, 0, "completed", self.losses)
        return None

    def _stopped(self, codes: list[int | None]) -> Outcome | None:
        """Every rank checkpointed and is leaving; some or all nodes were told to stop."""
        if any(c is None for c in codes):
            if time.monotonic() - self.stopped_at < self.STOP_EXIT_GRACE_S:
                return None
            self.backend.cancel(self.handles, 9)
        nodes = set(range(len(self.handles)))
        if self.sigterm_nodes >= nodes or not self.sigterm_nodes:
            return Outcome(False, 0, "stopped after a checkpoint", self.losses, "stopped")
        lost = sorted(self.sigterm_nodes)
        return Outcome(
            False, 0, f"node(s) {lost} preempted after a checkpoint", self.losses, "preempted", lost
        )

    def _consume_metrics(self) -> None:
        recs, self.offset = read_metrics(self.run.dir / "metrics.jsonl", self.offset)
        for rec in recs:
            self._record(rec)
            if self.on_event:
                self.on_event(rec)

    def _record(self, rec: dict) -> None:
        """Mirror one worker event into the state DB."""
        kind, rid = rec["kind"], self.run.id
        if kind == "step":
            self.losses.append(rec["loss"])
            self.db.update_run(
                rid, step=rec["step"], loss=rec["loss"], samples_per_s=rec["samples_per_s"]
            )
            self.pruning.step(rec["step"])
        elif kind == "checkpoint":
            self.finished = self.finished or rec["step"] == self.total
            self.db.update_run(rid, last_checkpoint=rec["step"])
            self.db.add_event(rid, "checkpoint", f"checkpoint at step {rec['step']} (local)")
        elif kind == "uploaded":  # ranks commit different steps, not in order
            self.last_upload = max(self.last_upload, rec["step"])
            self.db.update_run(rid, last_upload=self.last_upload)
            self.db.add_event(rid, "upload", f"checkpoint step {rec['step']} uploaded")
        elif kind == "heartbeat":
            self._heartbeat(rec)
        elif kind == "sigterm":
            self.sigterm_nodes.add(rec["node"])
        elif kind == "stopped" and self.stopped_at is None:
            self.stopped_at = time.monotonic()
            self.db.add_event(rid, "stopped", f"all ranks checkpointed step {rec['step']}")
        elif kind == "upload_error":
            self.db.add_event(rid, "upload_error", rec["error"], rec)
        elif kind in ("pruning", "profile"):
            self.pruning.record(rec)
        elif kind in REBALANCE_KINDS:
            self.rebalance.record(rec)

    def _heartbeat(self, rec: dict) -> None:
        self.beats.saw(rec["node"])
        d = self.detector
        d.observe(rec["step"], rec["rank"], rec["stage"], rec["node"], rec["compute_s"])
        d.close_step(rec["step"] - 2)  # heartbeats of a step arrive within a step or two
        slow = d.stragglers()
        if slow != self.stragglers:
            self.stragglers = slow
            nodes = d.nodes(slow)
            self.db.update_run(self.run.id, stragglers=",".join(map(str, slow)) or None)
            if slow:
                self.db.add_event(
                    self.run.id,
                    "straggler",
                    f"rank(s) {slow} on node(s) {nodes} persistently slower than "
                    f"their stage peers by > {100 * d.threshold:.0f} %",
                    {"ranks": slow, "nodes": nodes},
                )

    def _fail(self, code: int) -> Outcome:
        self.backend.cancel(self.handles, 9)
        rank = failing_rank(self.run.dir)
        where = f"rank {rank}" if rank is not None else "a node"
        log = self.run.dir / "logs" / (f"rank-{rank}.log" if rank is not None else "node-0.log")
        tail = "\n".join(last_lines(log))
        return Outcome(
            False,
            code or 1,
            f"{where} failed (exit {code}); last lines of {log}:\n{tail}",
            self.losses,
            "failed",
        )


def watch(
    monitor: Monitor,
    interval: float = 0.25,
    sleep: Callable[[float], None] = time.sleep,
    deadline: float | None = None,
) -> Outcome:
    """Poll until the run ends (or ``deadline`` seconds pass: then it is stopped)."""
    start = time.monotonic()
    while (outcome := monitor.poll_once()) is None:
        if deadline is not None and time.monotonic() - start > deadline:
            monitor.backend.cancel(monitor.handles, 9)
            return Outcome(False, 124, f"timed out after {deadline:.0f} s", monitor.losses)
        sleep(interval)
    return outcome
