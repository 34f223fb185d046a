"""The phases of a run and which transitions between them are legal.

Every transition is persisted (``StateDB.set_phase``) as the run's phase plus an
event, so ``jobctl status`` and ``jobctl events`` tell the whole story of a run and a
restarted supervisor knows where it stands. The supervisor (engine/supervise/supervisor.py)
walks a run through them:

    pending -> calibrating -> planning -> launching -> training -> completed
    training <-> checkpointing | pruning | rebalancing; the final upload: uploading
    (any active phase, or launching) -> morphing -> planning -> launching -> ...
    launching | active -> (jobctl stop) stopping -> stopped (or completed, failed)
    anything alive -> failed | stopped; failed / stopped -> (resume) calibrating ...

The active phases (training and what the workers do between steps) follow the
workers' records, which different ranks deliver in any order, so any active phase may
follow any other. ``uploading`` is the final upload the ranks wait for before they
exit; an upload in the background while training goes on is not a phase but the run's
``uploading_step`` field (engine/supervise/activity.py).

``stopping`` is a run whose nodes were asked to checkpoint and stop (``jobctl stop``,
engine/supervise/run_requests.py) and have not ended yet; the workers' records never
move it back to an active phase (activity.py manages only the active ones).
"""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    """Where a run is in its life."""

    PENDING = "pending"
    CALIBRATING = "calibrating"
    PLANNING = "planning"
    LAUNCHING = "launching"
    TRAINING = "training"
    PRUNING = "pruning"
    REBALANCING = "rebalancing"
    CHECKPOINTING = "checkpointing"
    UPLOADING = "uploading"
    MORPHING = "morphing"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"


ACTIVE = {Phase.TRAINING, Phase.PRUNING, Phase.REBALANCING, Phase.CHECKPOINTING, Phase.UPLOADING}
_ANY_LIVE = {
    Phase.PENDING,
    Phase.CALIBRATING,
    Phase.PLANNING,
    Phase.LAUNCHING,
    Phase.MORPHING,
    Phase.STOPPING,
    *ACTIVE,
}
# The phases a stop request moves to ``stopping``: nodes run that can checkpoint.
STOPPABLE = {Phase.LAUNCHING, *ACTIVE}
# A stopped (or failed) run can be resumed: calibrated, planned and launched again.
_RESUME = {Phase.CALIBRATING, Phase.PLANNING, Phase.LAUNCHING, Phase.MORPHING}

ALLOWED: dict[Phase, set[Phase]] = {
    Phase.PENDING: {Phase.CALIBRATING, Phase.PLANNING, Phase.LAUNCHING},
    Phase.CALIBRATING: {Phase.PLANNING},
    Phase.PLANNING: {Phase.LAUNCHING},
    # Nodes lost (or the supervisor gone) before the first step: morph and relaunch.
    Phase.LAUNCHING: {Phase.TRAINING, Phase.MORPHING},
    # A morph re-plans with the calibration it has (it is scale-invariant).
    Phase.MORPHING: {Phase.PLANNING, Phase.LAUNCHING},
    Phase.STOPPED: set(_RESUME),
    Phase.FAILED: set(_RESUME),
    Phase.COMPLETED: set(),
}
for _p in ACTIVE:
    # A batch job its scheduler requeues (preemption with requeue) waits in the queue again.
    ALLOWED[_p] = (ACTIVE - {_p}) | {Phase.MORPHING, Phase.COMPLETED, Phase.LAUNCHING}
# A stopping run ends (the last step may complete it); a node lost meanwhile, or its
# batch job requeued, still morphs or waits in the queue as a training one would.
ALLOWED[Phase.STOPPING] = {Phase.COMPLETED, Phase.MORPHING, Phase.LAUNCHING}
for _p in STOPPABLE:
    ALLOWED[_p] = ALLOWED[_p] | {Phase.STOPPING}
for _p in _ANY_LIVE:  # anything alive can fail or be stopped
    ALLOWED[_p] = ALLOWED[_p] | {Phase.FAILED, Phase.STOPPED}


class PhaseError(ValueError):
    """An illegal phase transition (a bug in the supervisor, never user input)."""


def check_transition(current: str, new: str) -> Phase:
    """Validate ``current -> new``; returns the new phase."""
    cur, nxt = Phase(current), Phase(new)
    if nxt is not cur and nxt not in ALLOWED[cur]:
        allowed = ", ".join(sorted(p.value for p in ALLOWED[cur])) or "none (terminal)"
        raise PhaseError(
            f"illegal phase transition {cur.value} -> {nxt.value}; "
            f"from {cur.value} the run may go to: {allowed}"
        )
    return nxt
