"""A rank that hosts two pipeline stages (ZB-V's V shape, ``schedule.placement``).

The model is cut into 2P stages; rank d of a replica hosts stage d and stage 2P-1-d.
Each stage keeps its own ``StepExecutor`` (its blocks, its saved activations, its
B/W split); ``TwoStageExecutor.run`` opens both stages' message boxes, then runs the
rank's one list of ``Placed`` actions in order, each on its stage. Where the two
stages are neighbours (stages P-1 and P, on the last rank) the activation and the
gradient between them are handed over in memory (``Handover``), not sent.

Across ranks the gloo channels stay as they are: between ranks d and d+1 the
activations of the stages going down and the gradients of those coming up travel in
the same direction, told apart by their tags (even: activation, odd: gradient).
Backends that ignore tags (NCCL) would mix them up, so this runs on gloo only.
"""

from __future__ import annotations

from collections.abc import Callable

from jobctl.engine.model.blocks import Stage, Tie
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.topology import Topology
from jobctl.engine.schedule.placement import Placed

__all__ = ["Handover", "TwoStageExecutor", "share_ties", "v_topology"]


class Handover:
    """Messages between two stages on one rank: ``send`` keeps, ``take`` hands over."""

    def __init__(self) -> None:
        self.items: dict = {}

    def send(self, i: int, t) -> None:  # noqa: ANN001 - a tensor, as the gloo Outbox
        self.items[i] = t

    def ready(self, i: int) -> bool:
        return i in self.items

    def take(self, i: int):  # noqa: ANN201
        return self.items.pop(i)

    def drain(self) -> None:
        """Nothing in flight: a hand-over is done when ``send`` returns."""


def v_topology(P: int, d: int, rank_of: Callable[[int], int]) -> list[Topology]:
    """The topologies of device d's two stages (d, 2P-1-d) of 2P, one replica.

    ``rank_of(device)`` is the rank of a device. A neighbour on this same rank is left
    None (the executor opens no channel to it; ``TwoStageExecutor`` hands over).
    """
    S = 2 * P

    def device(s: int) -> int:
        return s if s < P else S - 1 - s

    def peer(s: int) -> int | None:
        return None if not 0 <= s < S or device(s) == d else rank_of(device(s))

    me = rank_of(d)
    return [
        Topology(me, s, 0, S, 1, peer(s - 1), peer(s + 1), [me], None, [], None)
        for s in (d, S - 1 - d)
    ]


def share_ties(stages: list[Stage], ties: list[Tie]) -> None:
    """Give a tied tensor's two copies on this rank one Parameter (GPT's embedding on
    stage 0 and head on stage 2P-1 both live on rank 0): autograd then sums both uses
    into one gradient, as in one process, and no tie group is needed."""
    for tie in ties:
        owner = next((st for st in stages if st.has_param(tie.canonical)), None)
        alias = next((st for st in stages if st.has_param(tie.alias)), None)
        if owner is not None and alias is not None and owner is not alias:
            alias._set_param(tie.alias, owner.get_parameter(tie.canonical))


class TwoStageExecutor:
    """Runs one step of a rank's two stages from one list of ``Placed`` actions."""

    def __init__(self, executors: list[StepExecutor]) -> None:
        if len(executors) != 2:
            raise ValueError(f"a V rank hosts two stages, got {len(executors)}")
        self.by_stage = {ex.topo.stage: ex for ex in executors}

    def run(self, placed: list[Placed], step: int) -> StepStats:
        """Execute ``placed`` (this rank's list) for step ``step``; both stages'
        forward and backward times and losses go into one ``StepStats``."""
        runs = set()
        for s, ex in self.by_stage.items():
            runs |= {Placed(s, a) for a in ex.begin([a for t, a in placed if t == s], step)}
        self._hand_over()
        stats = StepStats()
        for p in placed:
            if p in runs:  # this replica's micro-batches (``StepExecutor.begin``)
                self.by_stage[p.stage]._do(p.action, stats)
                stats.order.append(p.action)
        for ex in self.by_stage.values():
            ex.finish()
        return stats

    def _hand_over(self) -> None:
        """Join the two stages in memory where one feeds the other (stages P-1, P)."""
        low, high = sorted(self.by_stage)
        if high != low + 1:
            return
        down, up = self.by_stage[low], self.by_stage[high]
        down.acts_out = up.acts_in = Handover()
        up.grads_out = down.grads_in = Handover()
