"""Process groups and neighbours of one worker, derived from the plan.

Every rank creates every group in the same order (torch.distributed requires it):
one data-parallel group per stage (the replicas of that stage, Varuna's first ring)
and, when the first and last stage hold the two halves of a tied weight, one group
joining both stages of all replicas, over which the tied weight's gradient is summed.
With T > 1 (tensor parallelism) each of these is one group per shard t (rank t of a
stage talks to rank t of its neighbours and replicas), and each (replica, stage) has
its T group, whose ranks split the stage's linears.
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
    t: int = 0  # this rank's tensor-parallel shard
    tp_ranks: list[int] | None = None  # its T group (T > 1)
    tp_group: object | None = None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.P - 1

    @property
    def is_reporter(self) -> bool:
        """The rank that reports step metrics: last stage of replica 0, shard 0."""
        return self.is_last and self.replica == 0 and self.t == 0


def tie_blocks(ties) -> set[int]:
    """The blocks that hold a copy of a tied tensor (``layers.<block>.`` names)."""
    return {int(n.split(".")[1]) for t in ties for n in (t.canonical, t.alias)}


def _tied_group(plan: Plan, rank: int, has_ties: bool | set[int]) -> tuple[list[int], object]:
    """The ranks holding a tied copy and their group (created collectively; one per
    shard t, as tied embeddings are not split).

    The stages holding a copy: first and last for the builtin GPT, any for a traced
    model (T5's shared embedding is read by encoder and decoder subgraphs).
    """
    if not has_ties or plan.P == 1:
        return [], None
    blocks = has_ties if isinstance(has_ties, set) else {0, plan.stages[-1].blocks[-1]}
    tied = [st for st in plan.stages if blocks & set(st.blocks)]
    mine: tuple[list[int], object] = ([], None)
    for t in range(plan.T):
        tied_ranks = sorted(r + t for st in tied for r in st.ranks)
        group = dist.new_group(tied_ranks)
        if rank in tied_ranks:
            mine = (tied_ranks, group)
    return mine


def _groups(plan: Plan, rank: int) -> tuple[object | None, object | None]:
    """Create the data-parallel groups (per stage and shard t) and the T groups (per
    replica and stage), collectively; this rank's two (None where it has none)."""
    me = plan.rank(rank) if rank < len(plan.ranks) else None
    dp_group = tp_group = None
    for st in plan.stages:
        for t in range(plan.T):
            ranks = [r + t for r in st.ranks]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if me is not None and (st.index, t) == (me.stage, me.tp_rank):
                dp_group = group
    if plan.T > 1:
        for st in plan.stages:
            for d, first in enumerate(st.ranks):
                group = dist.new_group(list(range(first, first + plan.T)))
                if me is not None and (st.index, d) == (me.stage, me.replica):
                    tp_group = group
    return dp_group, tp_group


def build_topology(plan: Plan, rank: int, has_ties: bool | set[int]) -> Topology | None:
    """Create all process groups (collectively) and return this rank's view.

    A rank the plan does not use (freed by packing) still takes part in creating the
    groups, which every process of the world must do, and gets None.
    """
    dp_group, tp_group = _groups(plan, rank)
    tied_ranks, tied_group = _tied_group(plan, rank, has_ties)
    if rank >= len(plan.ranks):
        return None
    d, p, t = plan.coords(rank)
    return Topology(
        rank=rank,
        stage=p,
        replica=d,
        P=plan.P,
        D=plan.D,
        prev=plan.rank_at(d, p - 1, t) if p > 0 else None,
        next=plan.rank_at(d, p + 1, t) if p < plan.P - 1 else None,
        dp_ranks=[r + t for r in plan.stages[p].ranks],
        dp_group=dp_group,
        tied_ranks=tied_ranks if rank in tied_ranks else [],
        tied_group=tied_group,
        t=t,
        tp_ranks=plan.tp_ranks(rank) if plan.T > 1 else None,
        tp_group=tp_group,
    )
