"""Recovery time: from the moment a node was lost to the next training step.

The moment of loss is the node's own last word: its preemption notice (the launch
script's ``node_sigterm`` record or a rank's ``sigterm`` record: SIGTERM, checkpoint
now, then exit), else its last heartbeat or ``alive`` ping (a node killed or hung says
nothing more: it died, or stopped responding, within one ping interval of that). The
end is the first ``step`` record of the attempt after the morph. Both are the workers'
wall-clock timestamps, so detection (heartbeat timeout, polling), re-planning and the
relaunch all count, as they should. The result goes to the run's ``recovery_s`` field
and a ``recovery`` event (``jobctl status`` / ``events`` show it), with ``steps_lost``:
completed steps trained again, the newest step trained before the loss minus the step
the next attempt resumed from (0 when the survivors handed their step over,
engine/supervise/handover.py; up to a checkpoint interval when it fell back).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jobctl.engine.state.db import StateDB


@dataclass(frozen=True)
class NodeLoss:
    """When nodes were lost, and which sign of theirs says so."""

    at: float  # wall-clock time (the workers' clock)
    nodes: list[int]
    sign: str  # "preemption notice" or "last heartbeat"
    trained: int = 0  # the newest step trained before the loss
    resumed: int | None = None  # the step the next attempt continues from
    source: str = "checkpoint"  # of that step: "emergency checkpoint" or "checkpoint"

    def resumed_at(self, step: int, handed_over: int | None) -> NodeLoss:
        """This loss, with where the next attempt continues (``handed_over``: the
        survivors' emergency step, if they wrote one)."""
        source = "emergency checkpoint" if handed_over == step else "checkpoint"
        return replace(self, resumed=step, source=source)

    def with_trained(self, step: int) -> NodeLoss:
        """This loss, knowing that ``step`` was trained before it (the newest counts)."""
        return replace(self, trained=max(self.trained, step))

    @property
    def steps_lost(self) -> int | None:
        """Completed steps trained again (None before the resume is known)."""
        return None if self.resumed is None else max(0, self.trained - self.resumed)


class LossClock:
    """Each node's last sign of life and its preemption notice, from worker records."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.notice: dict[int, float] = {}
        self.newest = 0  # the newest step any rank said it completed

    def stepped(self, step: int) -> None:
        """A rank completed ``step`` (its heartbeat, or the step record): a step's
        update follows its commit, so every rank summed that step's gradients."""
        self.newest = max(self.newest, step)

    def saw(self, node: int, ts: float) -> None:
        self.seen[node] = max(ts, self.seen.get(node, ts))

    def announced(self, node: int, ts: float) -> bool:
        """Note a preemption notice; True if it is the node's first."""
        first = node not in self.notice
        self.notice[node] = min(ts, self.notice.get(node, ts))
        return first

    def loss(self, nodes: list[int]) -> NodeLoss | None:
        """The earliest loss among ``nodes`` (None if none of them said anything)."""
        signs = []
        for n in nodes:
            if n in self.notice:
                signs.append((self.notice[n], "preemption notice"))
            elif n in self.seen:
                signs.append((self.seen[n], "last heartbeat"))
        if not signs:
            return None
        at, sign = min(signs)
        return NodeLoss(at, sorted(nodes), sign, trained=self.newest)


def record_recovery(db: StateDB, run_id: str, loss: NodeLoss, first_step_ts: float) -> float:
    """Persist one recovery (run field ``recovery_s`` and a ``recovery`` event)."""
    seconds = max(0.0, first_step_ts - loss.at)
    db.update_run(run_id, recovery_s=seconds)
    lost = loss.steps_lost
    said = f"; {lost} step(s) lost, from the {loss.source} of step {loss.resumed}"
    said = "" if lost is None else said
    db.add_event(
        run_id,
        "recovery",
        f"training again {seconds:.1f} s after losing node(s) {loss.nodes} "
        f"(from their {loss.sign}){said}",
        {
            "seconds": seconds,
            "lost_at": loss.at,
            "first_step_at": first_step_ts,
            "nodes": loss.nodes,
            "sign": loss.sign,
            "steps_lost": lost,
            "resumed": loss.resumed,
            "source": loss.source,
        },
    )
    return seconds
