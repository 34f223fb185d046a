"""The phases of a run and which transitions between them are legal.

Every transition is persisted (``StateDB.set_phase``) as the run's phase plus an
event, so ``jobctl status`` and ``jobctl events`` tell the whole story of a run and a
restarted supervisor knows where it stands. The supervisor (engine/supervise/supervisor.py)
walks a run through them:

    pending -> calibrating -> planning -> launching -> training -> completed
    training <-> checkpointing | pruning | rebalancing; the final upload: uploading
    (any active phase, or launching) -> morphing -> planning -> launching -> ...
    anything alive -> failed | stopped; failed / stopped -> (resume) calibrating ...

The active phases (training and what the workers do between steps) follow the
workers' records, which different ranks deliver in any order, so any active phase may
follow any other. ``uploading`` is the final upload the ranks wait for before they
exit; an upload in the background while training goes on is not a phase but the run's
``uploading_step`` field (engine/supervise/activity.py).
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
    *ACTIVE,
}
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
