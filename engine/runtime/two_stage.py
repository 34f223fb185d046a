"""A rank that hosts two pipeline stages (ZB-V's V shape, ``schedule.placement``).

The model is cut into 2P stages; rank d of a replica hosts stage d and stage 2P-1-d.
Each stage keeps its own ``StepExecutor`` (its blocks, its saved activations, its
B/W split); ``TwoStageExecutor.run`` opens both stages' message boxes, then runs the
rank's one list of ``Placed`` actions in order, each on its stage. Where the two
stages are neighbours (stages P-1 and P, on the last rank) the activation and the
gradient between them are handed over in memory (``Handover``), not sent.

Across ranks, ranks d and d+1 share two stage boundaries: the V's down leg (stages
d, d+1) and its up leg (2P-2-d, 2P-1-d). On one machine each boundary gets its own
shared-memory link (``v_links``), as a one-stage rank's neighbours do. Over gloo the
activations going down and the gradients coming up travel in the same direction,
told apart by their tags (even: activation, odd: gradient); backends that ignore
tags (NCCL) would mix them up, so a V plan runs on CPU ranks only.

In a job (a plan with a ``placement``), ``v_state`` builds the rank's ``StageState``:
its two stages as one ``RankStages`` module (every block under the unsplit model's
name, so the optimizer, the gradient sum and the per-block checkpoints see one stage
and a checkpoint loads under any other layout), the topology of its second stage (on
rank 0 the last stage: the rank that reports the loss) and its placed list;
``v_executor`` probes the two stages' channels, connects their links and builds the
``TwoStageExecutor``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import Sharding, TokenData
from jobctl.engine.model.blocks import ModelDef, Stage, Tie
from jobctl.engine.model.graph import boundary
from jobctl.engine.runtime import rng
from jobctl.engine.runtime.executor import Channels, StepExecutor, StepStats
from jobctl.engine.runtime.hook import StageState
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.p2p.gloo import send_ints, send_meta, send_value
from jobctl.engine.runtime.step import probe_channels, probe_output
from jobctl.engine.runtime.topology import Topology, build_topology
from jobctl.engine.schedule.placement import Placed, parse_placed
from jobctl.spec.sections import TrainingSpec

__all__ = [
    "Connect",
    "Handover",
    "RankStages",
    "TwoStageExecutor",
    "share_ties",
    "v_executor",
    "rank_stages",
    "v_links",
    "v_rank",
    "v_state",
    "v_topology",
]


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


def v_topology(
    P: int, d: int, rank_of: Callable[[int], int], base: Topology | None = None
) -> list[Topology]:
    """The topologies of device d's two stages (d, 2P-1-d) of 2P.

    ``rank_of(device)`` is the rank of a device in this replica. A neighbour on this
    same rank is left None (the executor opens no channel to it; ``TwoStageExecutor``
    hands over). ``base`` (``build_topology``'s for this rank) gives the replica and
    the data-parallel group, which both stages share (the replicas of a device host
    the same two stages); without it, one replica. No tied group: the tied embedding
    and head both live on device 0 (``share_ties``).
    """
    S = 2 * P

    def device(s: int) -> int:
        return s if s < P else S - 1 - s

    def peer(s: int) -> int | None:
        return None if not 0 <= s < S or device(s) == d else rank_of(device(s))

    me = rank_of(d)
    replica, D = (0, 1) if base is None else (base.replica, base.D)
    dp_ranks, dp_group = ([me], None) if base is None else (base.dp_ranks, base.dp_group)
    tp = {} if base is None else {"t": base.t, "tp_ranks": base.tp_ranks, "tp_group": base.tp_group}
    return [
        Topology(me, s, replica, S, D, peer(s - 1), peer(s + 1), dp_ranks, dp_group, [], None, **tp)
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

    def close(self) -> None:
        """No shared-memory links to give up (a V rank talks gloo only)."""
        for ex in self.by_stage.values():
            ex.close()

    def run(self, placed: list[Placed], step: int) -> StepStats:
        """Execute ``placed`` (this rank's list) for step ``step``; both stages'
        forward and backward times and losses go into one ``StepStats``."""
        runs = set()
        for s, ex in self.by_stage.items():
            # unfused: the device list may put the other stage's actions between a B
            # and its W, where the V schedule placed that W on purpose
            mine = [a for t, a in placed if t == s]
            runs |= {Placed(s, a) for a in ex.begin(mine, step, fuse=False)}
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


class RankStages(nn.Module):
    """A V rank's two stages as one module: ``layers`` holds both stages' blocks under
    their global index (the tied head, sharing the embedding's Parameter, is listed
    once), so ``named_parameters`` names every weight as one process does."""

    def __init__(self, stages: list[Stage], topos: list[Topology]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({k: m for st in stages for k, m in st.layers.items()})
        self.block_ids = [b for st in stages for b in st.block_ids]
        self.graph = None
        # plain attributes, not submodules: the blocks are registered once, above
        self.__dict__["parts"], self.__dict__["topos"] = stages, topos


def v_state(
    mdef: ModelDef,
    training: TrainingSpec,
    plan: Plan,
    rank: int,
    device: torch.device,
    shards: Callable[[Topology], object] | None = None,
) -> StageState:
    """The state of ``rank`` under a V plan (collective: creates every process group
    as ``build_topology`` does for any plan); ``shards(topo)``: T > 1, the split of
    each stage over the T group (``runtime.trainer``'s)."""
    whole, topo, placed = v_rank(mdef, plan, rank)
    whole.to(device)
    tp = None if shards is None else shards(topo)
    if tp is not None:  # T > 1: each of the two stages split over the T group
        for part in whole.parts:
            tp.apply(part)
    named = dict(whole.named_parameters())
    opt = build_optimizer(list(named.values()), training)
    return StageState(plan, whole, named, opt, topo, placed, tp=tp)  # type: ignore[arg-type]


def v_rank(mdef: ModelDef, plan: Plan, rank: int) -> tuple[RankStages, Topology, list[Placed]]:
    """``rank``'s two stages as one module, the topology it trains under (its second
    stage's: on rank 0 the last stage, which reports the loss) and its placed list
    (collective: creates every process group; ``runtime.migration`` builds a moved V
    rank through it too)."""
    # No tied group: both tied copies live on device 0 (``share_ties``).
    base = build_topology(plan, rank, False)
    me = plan.rank(rank)
    topos = v_topology(plan.P, me.stage, lambda d: plan.rank_at(me.replica, d, me.tp_rank), base)
    whole = rank_stages(mdef, plan, rank, topos)
    return whole, topos[1], parse_placed(plan.device_actions[me.stage])


def rank_stages(mdef: ModelDef, plan: Plan, rank: int, topos: list[Topology]) -> RankStages:
    """``rank``'s two stages as one module, under the topologies ``topos`` (another
    copy of a V rank's stages: AvgPipe's parallel models and reference)."""
    stages = [Stage(mdef, sp.blocks, sp.keep_blocks) for sp in plan.hosted(rank)]
    share_ties(stages, mdef.ties)
    return RankStages(stages, topos)


Connect = Callable[[int, tuple, torch.dtype], object]  # (peer, shape, dtype) -> link | None


def v_links(topos: list[Topology], chans: list[Channels], connect: Connect) -> list[dict]:
    """Each stage's links by peer rank, one per stage boundary this rank shares with
    another (``connect``: ``p2p.shm.connect`` bound to the machine; None: gloo).

    Both ranks of a boundary must meet in the same handshake, and ranks d and d+1
    meet twice: every rank connects its boundaries in order of the boundary's lower
    stage, so the lowest boundary not yet connected is the next one on both its
    ranks, and no two handshakes wait on each other in a cycle.
    """
    wanted = []  # (the boundary's lower stage, which stage of this rank, peer, shape, dtype)
    for k, (t, c) in enumerate(zip(topos, chans, strict=True)):
        if t.prev is not None:
            wanted.append((t.stage - 1, k, t.prev, c.in_shape, c.in_dtype))
        if t.next is not None:
            wanted.append((t.stage, k, t.next, c.out_shape, c.out_dtype))
    links: list[dict] = [{} for _ in topos]
    for _, k, peer, shape, dtype in sorted(wanted, key=lambda w: w[0]):
        links[k][peer] = connect(peer, shape, dtype)
    return links


def v_executor(
    whole: RankStages,
    data: TokenData,
    shard: Sharding,
    seq_len: int,
    device: torch.device,
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    connect: Connect | None = None,
) -> TwoStageExecutor:
    """Probe both stages' message shapes down the V, connect the stages' links
    (``connect``; without it, gloo), then the rank's executor."""
    (down, up), (t_down, t_up) = whole.parts, whole.topos
    c_down, x = probe_output(down, t_down, shard.micro_batch, seq_len, device, compute)
    if t_up.prev is not None:
        c_up = probe_channels(up, t_up, shard.micro_batch, seq_len, device, compute)
    else:  # stages P-1 and P: the second stage's input is the first one's output
        if up.graph is not None:  # a traced carrier: its layout is the first stage's
            up.graph.in_boundary = down.graph.out_boundary
        tokens = torch.zeros(shard.micro_batch, seq_len, dtype=torch.long, device=device)
        with torch.no_grad(), rng.isolated(device), compute():
            out = up(x, up.batch(tokens, tokens.clone(), 0))
        if t_up.next is not None:
            send_meta(out, t_up.next)
            if up.graph is not None:
                send_ints(boundary.encode(up.graph.out_boundary), t_up.next)
            send_value(out, t_up.next)  # what probe_channels receives next
        c_up = Channels(c_down.out_shape, c_down.out_dtype, tuple(out.shape), out.dtype)
    chans = [c_down, c_up]
    links = v_links([t_down, t_up], chans, connect) if connect else [{}, {}]
    parts = zip((down, up), (t_down, t_up), chans, links, strict=True)
    executors = [StepExecutor(st, t, data, shard, c, device, links=ln) for st, t, c, ln in parts]
    return TwoStageExecutor(executors)
