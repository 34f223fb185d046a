"""What a training run is doing between steps, from its workers' records, as phases.

The workers report what they did, not what they are about to do, so each phase is
derived from the records that bracket it:

* ``checkpointing``: from the step record of a step whose checkpoint is due (every
  ``checkpoint.interval`` steps and the last one), or from a rank's ``sigterm`` record
  (a stop or preemption notice: checkpoint at the end of this step), until the
  ``checkpoint`` record of that step or a newer one (the checkpoint is published
  locally; a snapshot the writer replaced by a newer one is covered by the newer).
  Training goes on meanwhile: the write is in the background (Varuna).
* ``rebalancing``: from a ``rebalanced`` / ``packed`` record (layers moved at step s)
  until the first step on the new layout (a step record after s) is done.
* ``uploading``: once the final checkpoint is published while its upload to the
  remote store is still going: the ranks wait for it before they exit. Uploads during
  training run in the background and are not a phase: the run's ``uploading_step``
  field names the step in flight (None when none is).

``pruning`` belongs to engine/pruning/events.py; this watch leaves a pruning run
alone except to enter ``rebalancing`` (after pruning and profiling, layers move:
DynPipe). Transitions are compare-and-set (``StateDB.set_phase_if``), so a phase some
other part of the supervisor set meanwhile (queued, pruning, morphing) is never undone.
"""

from __future__ import annotations

import time

from jobctl.engine.core.events import Kind
from jobctl.engine.state.db import StateDB

MANAGED = {"training", "checkpointing", "rebalancing", "uploading"}
# A phase this watch saw equal to the one it wants is read again only after this long:
# a step record no longer costs a database read (a MANAGED phase another part set in
# between is put right within it; any other phase is never undone anyway).
RECHECK_S = 1.0
KINDS = {
    Kind.STEP,
    Kind.CHECKPOINT,
    Kind.SIGTERM,
    Kind.REBALANCED,
    Kind.PACKED,
    Kind.UPLOAD,
    Kind.UPLOADED,
}


class ActivityWatch:
    """Turns checkpoint, upload and layer-move records into the run's active phase."""

    def __init__(self, db: StateDB, run_id: str, interval: int, total: int, remote: bool):
        self.db, self.run_id = db, run_id
        self.interval, self.total, self.remote = interval, total, remote
        self.last_step = 0
        self.ckpt_due: int | None = None  # lowest step whose checkpoint is awaited
        self.moved_at: int | None = None  # layers moved after this step
        self.finished = False  # the final checkpoint is published
        self.waited_upload = False  # the run went uploading for the final checkpoint
        self.uploaded = -1
        self.uploading: int | None = None
        self.note = ""
        self._seen: tuple[str | None, float] = (None, 0.0)  # the run's phase, read when

    def record(self, rec: dict) -> None:
        """Follow one worker record; changes the run's phase when its activity changed."""
        kind = rec["kind"]
        if kind not in KINDS:
            return
        if kind in (Kind.UPLOAD, Kind.UPLOADED):
            self._upload(kind, rec["step"])
            if kind == Kind.UPLOAD or not self.finished:
                return  # a background upload changes no phase
        elif kind == Kind.STEP:
            self._step(rec["step"])
        elif kind == Kind.SIGTERM and self.ckpt_due is None:
            self.ckpt_due = self.last_step
            self.note = f"node {rec.get('node')} told to stop: checkpoint at the end of the step"
        elif kind == Kind.CHECKPOINT:
            self._checkpoint(rec["step"])
        elif kind in (Kind.REBALANCED, Kind.PACKED):
            moved = rec.get("moved_at", rec["step"])
            if self.last_step <= moved:  # the new layout's first step is not in yet
                self.moved_at = moved
                self.note = f"layers moved after step {moved} ({kind})"
        self._sync()

    def _step(self, step: int) -> None:
        self.last_step = max(self.last_step, step)
        if self.moved_at is not None and step > self.moved_at:
            self.moved_at = None
            self.note = f"step {step} trained on the new layout"
        due = step % self.interval == 0 or step == self.total
        if due and self.ckpt_due is None:
            self.ckpt_due = step
            self.note = f"writing the checkpoint of step {step}"

    def _checkpoint(self, step: int) -> None:
        if self.ckpt_due is not None and step >= self.ckpt_due:
            self.ckpt_due = None
            self.note = f"checkpoint of step {step} written"
        self.finished = self.finished or step >= self.total
        if self.finished and self.remote and self.uploaded < self.total:
            self.note = f"final checkpoint (step {step}) uploading"

    def _upload(self, kind: str, step: int) -> None:
        if kind == Kind.UPLOADED:
            self.uploaded = max(self.uploaded, step)
            if self.uploading is not None and self.uploaded >= self.uploading:
                self.uploading = None
                self.db.update_run(self.run_id, uploading_step=None)
        elif step > self.uploaded and step != self.uploading:
            self.uploading = step
            self.db.update_run(self.run_id, uploading_step=step)

    def desired(self) -> str | None:
        """The phase the records say the run is in; None: leave it as it is."""
        if self.moved_at is not None:
            return "rebalancing"
        if self.ckpt_due is not None:
            return "checkpointing"
        if self.finished and self.remote and self.uploaded < self.total:
            self.waited_upload = True
            return "uploading"
        # The final upload is done: the ranks are leaving, the run completes next.
        return None if self.waited_upload else "training"

    def _sync(self) -> None:
        target = self.desired()
        if target is None:
            return
        seen, when = self._seen
        if seen == target and time.monotonic() - when < RECHECK_S:
            return  # nothing changed here: no read per step record (#55)
        row = self.db.get_run(self.run_id)
        current = row["phase"] if row else None
        self._seen = (current, time.monotonic())
        if current == target:
            return
        movable = current in MANAGED or (current == "pruning" and target == "rebalancing")
        if movable and self.db.set_phase_if(self.run_id, {current}, target, self.note):
            self._seen = (target, time.monotonic())
