"""The phases of a run and which transitions between them are legal.

Every transition is persisted (``StateDB.set_phase``) as the run's phase plus an
event, so ``jobctl status`` and ``jobctl events`` tell the whole story of a run and a
restarted supervisor knows where it stands.
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


TERMINAL = {Phase.COMPLETED, Phase.FAILED}
_ACTIVE = {Phase.TRAINING, Phase.PRUNING, Phase.REBALANCING, Phase.CHECKPOINTING, Phase.UPLOADING}
_ANY_LIVE = {
    Phase.PENDING,
    Phase.CALIBRATING,
    Phase.PLANNING,
    Phase.LAUNCHING,
    Phase.MORPHING,
    *_ACTIVE,
}

ALLOWED: dict[Phase, set[Phase]] = {
    Phase.PENDING: {Phase.CALIBRATING, Phase.PLANNING, Phase.LAUNCHING},
    Phase.CALIBRATING: {Phase.PLANNING},
    Phase.PLANNING: {Phase.LAUNCHING},
    Phase.LAUNCHING: {Phase.TRAINING},
    Phase.MORPHING: {Phase.PLANNING, Phase.LAUNCHING},
    # A stopped (or failed) run can be resumed: it is planned and launched again.
    Phase.STOPPED: {Phase.PLANNING, Phase.LAUNCHING, Phase.MORPHING},
    Phase.FAILED: {Phase.PLANNING, Phase.LAUNCHING, Phase.MORPHING},
    Phase.COMPLETED: set(),
}
for _p in _ACTIVE:
    ALLOWED[_p] = (_ACTIVE - {_p}) | {Phase.MORPHING, Phase.COMPLETED}
# A batch job its scheduler requeues (preemption with requeue) waits in the queue again.
ALLOWED[Phase.TRAINING] |= {Phase.LAUNCHING}
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
