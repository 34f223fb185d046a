"""Process groups and neighbours of one worker, derived from the plan.

Every rank creates every group in the same order (torch.distributed requires it):
one data-parallel group per stage (the replicas of that stage, Varuna's first ring)
and, when the first and last stage hold the two halves of a tied weight, one group
joining both stages of all replicas, over which the tied weight's gradient is summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from jobctl.engine.core.plan import Plan


@dataclass
class Topology:
    """Where this rank sits in the P x D grid and whom it talks to."""

    rank: int
    stage: int
    replica: int
    P: int
    D: int
    prev: int | None  # rank of stage-1 in the same replica
    next: int | None  # rank of stage+1 in the same replica
    dp_ranks: list[int]
    dp_group: object | None
    tied_ranks: list[int]
    tied_group: object | None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.P - 1

    @property
    def is_reporter(self) -> bool:
        """The rank that reports step metrics: last stage of replica 0."""
        return self.is_last and self.replica == 0


def tie_blocks(ties) -> set[int]:
    """The blocks that hold a copy of a tied tensor (``layers.<block>.`` names)."""
    return {int(n.split(".")[1]) for t in ties for n in (t.canonical, t.alias)}


def _tied_group(plan: Plan, rank: int, has_ties: bool | set[int]) -> tuple[list[int], object]:
    """The ranks holding a tied copy and their group (created collectively).

    The stages holding a copy: first and last for the builtin GPT, any for a traced
    model (T5's shared embedding is read by encoder and decoder subgraphs).
    """
    if not has_ties or plan.P == 1:
        return [], None
    blocks = has_ties if isinstance(has_ties, set) else {0, plan.stages[-1].blocks[-1]}
    tied = [st for st in plan.stages if blocks & set(st.blocks)]
    tied_ranks = sorted(r for st in tied for r in st.ranks)
    group = dist.new_group(tied_ranks)
    return tied_ranks, (group if rank in tied_ranks else None)


def build_topology(plan: Plan, rank: int, has_ties: bool | set[int]) -> Topology | None:
    """Create all process groups (collectively) and return this rank's view.

    A rank the plan does not use (freed by packing) still takes part in creating the
    groups, which every process of the world must do, and gets None.
    """
    member = rank < len(plan.ranks)
    dp_group = None
    for st in plan.stages:
        group = dist.new_group(st.ranks) if len(st.ranks) > 1 else None
        if member and st.index == plan.rank(rank).stage:
            dp_group = group
    tied_ranks, tied_group = _tied_group(plan, rank, has_ties)
    if not member:
        return None
    me = plan.rank(rank)
    stage = plan.stages[me.stage]
    prev = plan.stages[me.stage - 1].ranks[me.replica] if me.stage > 0 else None
    nxt = plan.stages[me.stage + 1].ranks[me.replica] if me.stage < plan.P - 1 else None
    return Topology(
        rank=rank,
        stage=me.stage,
        replica=me.replica,
        P=plan.P,
        D=plan.D,
        prev=prev,
        next=nxt,
        dp_ranks=list(stage.ranks),
        dp_group=dp_group,
        tied_ranks=tied_ranks if rank in tied_ranks else [],
        tied_group=tied_group,
    )
