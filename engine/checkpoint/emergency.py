"""The emergency checkpoint: the survivors of a lost node write the step they hold.

When a node is lost and every pipeline stage still has a live replica, the survivors
hold the whole training state of the newest committed step (engine/runtime/failure.py).
``decide`` turns what each survivor says it holds into one decision that every
survivor computes alike: the step, the loss of that step, and which survivor writes
which block (a stage's blocks dealt over its surviving replicas, so each block is
written once). ``write_part`` writes one survivor's blocks as an ordinary
layout-independent checkpoint of that step (``checkpoint.blocks``), published by the
part that completes it, so a resume of any P x D finds it like any other. Where some
stage has no survivor, or the survivors do not hold one consistent step, the decision
says why and the run falls back to its newest complete checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jobctl.engine.checkpoint.blocks import Snapshot, write_meta, write_snapshot
from jobctl.engine.checkpoint.store.format import MANIFEST_NAME, step_dirname
from jobctl.engine.checkpoint.store.local import publish_local, stage_dir
from jobctl.engine.core.plan import Plan


@dataclass(frozen=True)
class Decision:
    """What the survivors do: write ``step`` (None: fall back, ``why``)."""

    step: int | None
    why: str = ""
    loss: float | None = None  # the step's loss (committed, so known to every survivor)
    blocks: dict[int, list[int]] = field(default_factory=dict)  # writer rank -> blocks

    @property
    def parts(self) -> list[str]:
        return [part_name(r) for r in sorted(self.blocks)]

    @property
    def leader(self) -> int | None:
        """The writer of ``meta.json`` (and of a missing ``step`` record)."""
        return min(self.blocks) if self.blocks else None


def part_name(rank: int) -> str:
    return f"emergency-rank-{rank}"


def uncovered_stages(plan: Plan, survivors: list[int]) -> list[int]:
    """Stages of ``plan`` with no replica among ``survivors``."""
    covered = {plan.rank(r).stage for r in survivors}
    return [s for s in range(plan.P) if s not in covered]


def survivors_of(plan: Plan, lost_nodes: list[int], gone: set[int] = frozenset()) -> list[int]:
    """Ranks not on a lost node (nor already gone, e.g. packed away)."""
    return [r.rank for r in plan.ranks if r.node not in lost_nodes and r.rank not in gone]


def decide(plan: Plan, held: dict[int, dict]) -> Decision:
    """The decision every survivor reaches from every survivor's ``Held.as_record``."""
    missing = uncovered_stages(plan, list(held))
    if missing:
        return Decision(None, f"no live replica of stage(s) {missing}")
    step = max(h["committed"] for h in held.values())
    behind = [
        r
        for r, h in held.items()
        if h["done"] < step - 1 or (h["done"] == step - 1 and not h["ready"])
    ]
    if behind:
        return Decision(None, f"rank(s) {sorted(behind)} cannot reach step {step}")
    if step == 0:
        return Decision(None, "no step was completed")
    losses = [h["losses"][str(step)] for h in held.values() if str(step) in h["losses"]]
    return Decision(step, "", losses[0] if losses else None, _deal(plan, sorted(held)))


def _deal(plan: Plan, survivors: list[int]) -> dict[int, list[int]]:
    """Each stage's blocks dealt over its surviving replicas (lowest replica first)."""
    out: dict[int, list[int]] = {}
    for s, stage in enumerate(plan.stages):
        mine = sorted(
            (r for r in survivors if plan.rank(r).stage == s), key=lambda r: plan.rank(r).replica
        )
        for k, block in enumerate(stage.blocks):
            out.setdefault(mine[k % len(mine)], []).append(block)
    return out


def write_part(
    root: Path, decision: Decision, rank: int, snap: Snapshot, meta: dict
) -> Path | None:
    """Write this survivor's blocks of the decided step and record its part; returns
    the published folder when this part completed it (or it was complete already)."""
    step = decision.step
    target = Path(root) / step_dirname(step)
    if (target / MANIFEST_NAME).exists():
        return target  # a regular checkpoint of this very step was published
    staging = stage_dir(root, step)
    files = write_snapshot(snap, staging)
    if rank == decision.leader:
        files.append(write_meta(staging, {**meta, "emergency": True}))
    return publish_local(root, step, part_name(rank), files, meta, decision.parts)
