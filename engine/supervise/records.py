"""What one attempt's worker records say, mirrored into the state DB as they arrive.

``AttemptRecords.record`` dispatches each record of ``metrics.jsonl`` through a table
keyed by the event kinds of engine/core/events.py, one small handler per kind. The
monitor (engine/supervise/monitor.py) reads the state kept here (trained, checkpointed,
stopped, the nodes told to stop, the ranks packed away) to classify how the attempt
ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from jobctl.engine.channel.liveness import HeartbeatWatch
from jobctl.engine.core import event_schema
from jobctl.engine.core.events import Kind
from jobctl.engine.pruning.events import PruningWatch
from jobctl.engine.rebalance.events import KINDS as REBALANCE_KINDS
from jobctl.engine.rebalance.events import RebalanceWatch
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.recovery import LossClock
from jobctl.engine.supervise.scaling import ScaleWatch
from jobctl.engine.supervise.stragglers import StragglerDetector

log = logging.getLogger("jobctl.supervise")


class AttemptRecords:
    """The state of one attempt as its workers' records tell it."""

    epoch = 0  # of the newest step (file data sources count epochs); set per instance

    def __init__(
        self,
        db: StateDB,
        run_id: str,
        total_steps: int,
        watches: tuple[HeartbeatWatch, ScaleWatch],
        straggler_threshold: float,
        clock: Callable[[], float],
        bounds: event_schema.Bounds | None = None,
    ):
        self.db, self.run_id, self.total, self.clock = db, run_id, total_steps, clock
        self.bounds = bounds  # the plan's: a record beyond them is not this run's
        self.beats, self.scaling = watches  # the monitor's, which it also polls
        self.losses: list[float] = []
        self.last_upload = -1
        self.uploaded_steps: set[int] = set()  # each step's upload is news once
        self.finished = False
        self.detector = StragglerDetector(threshold=straggler_threshold)
        self.stragglers: list[int] = []
        self.pruning = PruningWatch(db, run_id)
        self.rebalance = RebalanceWatch(db, run_id)
        self.lost = LossClock()
        self.first_step_ts: float | None = None  # this attempt's first step (worker clock)
        self.started: set[int] = set()  # ranks that sent a heartbeat in this attempt
        self.freed_ranks: dict[int, int] = {}  # packed away: rank -> its node script
        self.malformed = 0  # records skipped: no handler could read them
        self.snapshot_rates: list[float] = []  # bytes/s of each checkpoint's host copy
        self.snapshot_sizes: list[float] = []  # bytes of each checkpoint's host copy
        self.step_s: dict[int, float] = {}  # step -> its period (checkpoint_added_s)
        self.restart()
        self.handlers = self._handlers()

    def _handlers(self) -> dict[str, Callable[[dict], None]]:
        """Each kind's handler (kinds with none are the views' only)."""
        return {
            Kind.STEP: self._on_step,
            Kind.EVAL: self._on_eval,
            Kind.CHECKPOINT: self._on_checkpoint,
            Kind.UPLOADED: self._on_uploaded,
            Kind.HEARTBEAT: self._on_heartbeat,
            Kind.ALIVE: self._on_alive,
            Kind.SIGTERM: self._on_sigterm,
            Kind.NODE_SIGTERM: self._on_node_sigterm,
            Kind.STOPPED: self._on_stopped,
            Kind.UPLOAD_ERROR: self._on_upload_error,
            Kind.PRUNING: self.pruning.record,
            Kind.PROFILE: self.pruning.record,
            Kind.FREED: self._on_freed,
            **dict.fromkeys(REBALANCE_KINDS, self.rebalance.record),
        }

    def restart(self) -> None:
        """Forget what the last run of the batch job did: its scheduler requeued it."""
        self.trained = self.checkpointed = False  # in this attempt
        self.sigterm_nodes: set[int] = set()  # nodes whose ranks got SIGTERM
        self.node_sigterm: set[int] = set()  # nodes whose launch script got SIGTERM
        self.stopped_at: float | None = None  # the monitor's clock at the first ``stopped``
        self.stopped_ranks: set[int] = set()  # ranks that checkpointed and are leaving
        self.stopped_step: int | None = None

    def record(self, rec: dict) -> bool:
        """Follow one worker record (kinds with no handler are the views' only); one the
        handlers cannot read is counted and logged, never fatal: the channel checks every
        event, but a worker on a shared disk appends to ``metrics.jsonl`` directly. True when
        the record was followed: only those reach the monitor's other readers."""
        why = event_schema.problem(rec)
        if why is None and self.bounds is not None:
            why = self.bounds.problem(rec)
        if why is not None:
            self._malformed(why)
            return False
        kind = rec["kind"]
        if "ts" in rec and kind in (Kind.HEARTBEAT, Kind.ALIVE):
            self.lost.saw(rec["node"], rec["ts"])
        handler = self.handlers.get(kind)
        try:
            if handler is not None:
                handler(rec)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            self._malformed(f"{kind!r}: {type(e).__name__}: {e}")  # a nested field
            return False
        return True

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        log.warning("run %s: skipped a worker record: %s", self.run_id, why[:200])

    def _on_step(self, rec: dict) -> None:
        self.trained = True
        self.first_step_ts = self.first_step_ts or rec.get("ts")
        self.losses.append(rec["loss"])
        if isinstance(rec.get("step_time_s"), int | float):
            self.step_s[rec["step"]] = rec["step_time_s"]
        self.db.update_run(
            self.run_id, step=rec["step"], loss=rec["loss"], samples_per_s=rec["samples_per_s"]
        )
        self.pruning.step(rec["step"])
        self._note_epoch(rec)

    def _note_epoch(self, rec: dict) -> None:
        """An event when a step starts a new epoch of a file data source."""
        epoch = rec.get("epoch")
        if epoch and epoch != self.epoch:
            self.epoch = epoch
            note = f"epoch {epoch} began at step {rec['step']}"
            self.db.add_event(self.run_id, "epoch", note, {"epoch": epoch, "step": rec["step"]})

    def _on_eval(self, rec: dict) -> None:
        note = f"eval loss {rec['eval_loss']:.4f} at step {rec['step']}"
        data = {"step": rec["step"], "loss": rec["eval_loss"]}
        self.db.add_event(self.run_id, "eval", note, data)

    def _on_checkpoint(self, rec: dict) -> None:
        step = rec["step"]
        self.checkpointed = True
        self.scaling.checkpointed(rec.get("ts", 0.0))
        self.finished = self.finished or step == self.total
        self.db.update_run(self.run_id, last_checkpoint=step)
        copied, seconds = rec.get("snapshot_bytes"), rec.get("snapshot_s")
        if isinstance(copied, int | float) and isinstance(seconds, int | float) and seconds > 0:
            self.snapshot_rates.append(copied / seconds)
            self.snapshot_sizes.append(copied)
        note = f"checkpoint at step {step} (local)"
        self.db.add_event(self.run_id, "checkpoint", note, {"step": step})

    def _on_uploaded(self, rec: dict) -> None:
        # Every rank sharing the disk reports the commit it saw (``CheckpointManager.
        # poll``): the first report is the news; the others would repeat the event and
        # cost the database two transactions each, per checkpoint (#55's profile).
        step = rec["step"]
        if step in self.uploaded_steps:
            return
        self.uploaded_steps.add(step)
        self.last_upload = max(self.last_upload, step)  # ranks commit steps out of order
        self.db.update_run(self.run_id, last_upload=self.last_upload)
        self.db.add_event(self.run_id, "upload", f"checkpoint step {step} uploaded", {"step": step})

    def _on_alive(self, rec: dict) -> None:
        """The rank's sender thread: the machine is there, maybe waiting."""
        self.beats.saw(rec["node"])

    def _on_sigterm(self, rec: dict) -> None:
        self.sigterm_nodes.add(rec["node"])
        self._notice(rec)

    def _on_node_sigterm(self, rec: dict) -> None:
        self.node_sigterm.add(rec["node"])
        self._notice(rec)

    def _notice(self, rec: dict) -> None:
        """A node's SIGTERM (preemption notice, stop): persisted with its own time, which
        the recovery time of a morph that drops the node starts from."""
        node, ts = rec["node"], rec.get("ts", self.db.clock())
        if self.lost.announced(node, ts):
            msg = f"node {node} got SIGTERM: checkpoint at the end of the step, then leave"
            self.db.add_event(self.run_id, "sigterm", msg, {"node": node, "ts": ts})

    def _on_stopped(self, rec: dict) -> None:
        self.stopped_ranks.add(rec.get("rank", -1))
        self.stopped_step = rec.get("step")  # the step every rank checkpointed
        if self.stopped_at is None:
            self.stopped_at = self.clock()
            note = f"all ranks checkpointed step {rec['step']}"
            self.db.add_event(self.run_id, "stopped", note, {"step": rec["step"]})

    def _on_upload_error(self, rec: dict) -> None:
        self.db.add_event(self.run_id, "upload_error", rec["error"], rec)

    def _on_freed(self, rec: dict) -> None:
        self.freed_ranks[rec["rank"]] = rec["host_node"]

    def _on_heartbeat(self, rec: dict) -> None:
        self.beats.saw(rec["node"])
        self.lost.stepped(rec["step"])  # steps lost count completed steps, reported or not
        self.started.add(rec["rank"])
        d = self.detector
        d.observe(rec["step"], rec["rank"], rec["stage"], rec["node"], rec["compute_s"])
        d.close_step(rec["step"] - 2)  # heartbeats of a step arrive within a step or two
        slow = d.stragglers()
        if slow == self.stragglers:
            return
        self.stragglers = slow
        nodes = d.nodes(slow)
        self.db.update_run(self.run_id, stragglers=",".join(map(str, slow)) or None)
        if slow:
            self.db.add_event(
                self.run_id,
                "straggler",
                f"rank(s) {slow} on node(s) {nodes} persistently slower than "
                f"their stage peers by > {100 * d.threshold:.0f} %",
                {"ranks": slow, "nodes": nodes},
            )
