"""One candidate plan's integer choices and where its ranks run.

A ``Layout`` is P stages x D replicas at micro-batch size m with M micro-batches and a
schedule; a ``Hosting`` places its ranks on nodes (``place``) and says which of them
share a node, an allreduce ring's node or a host's cores.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from jobctl.engine.core.plan import RankPlan


@dataclass(frozen=True)
class Layout:
    """The integer choices of one candidate plan."""

    P: int
    D: int
    m: int
    M: int
    schedule: str
    recompute: bool = False  # gpipe / 1f1b with recompute (varuna, scp always recompute)

    @property
    def devices(self) -> int:
        return self.P * self.D

    def label(self) -> str:
        rec = "+recompute" if self.recompute else ""
        return f"P={self.P} D={self.D} m={self.m} M={self.M} {self.schedule}{rec}"


@dataclass(frozen=True)
class Hosting:
    """Where ranks run: placement on nodes, and which ranks share a host's cores."""

    P: int
    D: int
    per_node: int
    placement: str  # stage_major | pipeline_major (see ``place``)
    one_host: bool  # the local backend: every "node" is this machine
    share_cores: bool  # CPU workers compete for the host's cores
    oversubscribed: bool = False  # more of them than cores: waiting ranks wait for a core

    def rank(self, stage: int, replica: int) -> int:
        if self.placement == "pipeline_major":
            return replica * self.P + stage
        return stage * self.D + replica

    def position(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of ``rank``: the inverse of ``rank``."""
        if self.placement == "pipeline_major":
            return rank % self.P, rank // self.P
        return divmod(rank, self.D)

    def same_node(self, *pairs: tuple[int, int]) -> bool:
        """Do the (stage, replica) ranks from the lowest to the highest share a node?

        Nodes hold consecutive ranks, so a group shares one node exactly when its
        lowest and highest rank do: callers pass just those ends.
        """
        if self.one_host:
            return True
        ranks = [self.rank(s, d) for s, d in pairs]
        return min(ranks) // self.per_node == max(ranks) // self.per_node

    def rings_sharing(self, stage: int) -> int:
        """How many stages' allreduce rings have members on this stage's nodes."""
        P, D, pn = self.P, self.D, self.per_node
        if self.one_host:
            return P
        if self.placement == "pipeline_major":
            return min(P, pn)
        first, last = stage * D // pn, (stage * D + D - 1) // pn  # this stage's nodes
        return min(P - 1, (min((last + 1) * pn, P * D) - 1) // D) - first * pn // D + 1

    def nic_sharing(self, boundary: int) -> int:
        """How many ranks share the NIC that boundary ``boundary``'s sends cross.

        A point-to-point send between stages s and s+1 (replica 0 stands for all) on
        different nodes goes through the sender's NIC, which every rank of that node
        with a neighbour on another node also sends through, one message per
        micro-batch each in steady state (activations forward, gradients back):
        fluid sharing gives each of them 1/k of the NIC. 1 within a node.
        """
        if self.one_host or self.same_node((boundary, 0), (boundary + 1, 0)):
            return 1
        return _nic_sharing(self, boundary)

    @property
    def ranks(self) -> list[RankPlan]:
        return place(self.P, self.D, self.per_node, self.placement)

    @property
    def nodes(self) -> int:
        """Nodes the ranks occupy: ``place`` puts rank r on node r // per_node (without
        building P x D rank records)."""
        return (self.P * self.D - 1) // self.per_node + 1


@functools.lru_cache(maxsize=4096)
def _nic_sharing(hosting: Hosting, boundary: int) -> int:
    """``Hosting.nic_sharing`` across nodes (cached: the search asks per candidate)."""
    node = hosting.rank(boundary, 0) // hosting.per_node
    ranks = range(node * hosting.per_node, (node + 1) * hosting.per_node)
    count = 0
    for rank in ranks[: max(0, hosting.P * hosting.D - ranks.start)]:
        s, d = hosting.position(rank)
        peers = [(t, d) for t in (s - 1, s + 1) if 0 <= t < hosting.P]
        count += any(not hosting.same_node((s, d), p) for p in peers)
    return max(1, count)


def place(P: int, D: int, per_node: int, placement: str) -> list[RankPlan]:
    """Map ranks to (stage, replica) and nodes.

    ``stage_major`` puts the replicas of one stage next to each other, so the
    data-parallel allreduce (the heavy traffic) stays inside a node where it can;
    ``pipeline_major`` keeps each pipeline's stages together instead.
    """
    out = []
    for rank in range(P * D):
        if placement == "pipeline_major":
            stage, replica = rank % P, rank // P
        else:
            stage, replica = rank // D, rank % D
        out.append(
            RankPlan(
                rank=rank,
                node=rank // per_node,
                local_rank=rank % per_node,
                stage=stage,
                replica=replica,
            )
        )
    return out
