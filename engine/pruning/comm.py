"""The collectives of a pruning step: who selects, over which group, and how masks spread.

Replica 0's pipeline selects (DynPipe Alg. 2): its stages gather their candidates over a
process group of just those ranks (created by them alone, so ranks freed by packing
never have to join), in model order. The other replicas hold the same weights and
simply receive replica 0's masks over their stage's data-parallel group, so every
replica ends with identical masks. Tensors of different lengths are gathered padded
to the longest (gloo's ``all_gather`` needs one size).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from jobctl.engine.runtime.p2p.gloo import comm_device


def world(group=None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def all_gather_var(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """``all_gather`` of 1-D tensors of different lengths, in group-rank order."""
    n_ranks = world(group)
    if n_ranks == 1:
        return [t.reshape(-1)]
    dev = comm_device()
    n = torch.tensor([t.numel()], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(n_ranks)]
    dist.all_gather(sizes, n, group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=t.dtype, device=dev)
    padded[: t.numel()] = t.reshape(-1).to(dev)
    out = [torch.empty_like(padded) for _ in range(n_ranks)]
    dist.all_gather(out, padded, group=group)
    return [o[: int(s)].to(t.device) for o, s in zip(out, sizes, strict=True)]


class SelectorGroups:
    """Finds replica 0's pipeline (in model order) and the group its stages gather over.

    A plain ``new_group`` must be entered by every rank of the world, so the group of
    replica 0's pipeline is made once, when all ranks build their Pruner. When the live
    ranks are replica 0's pipeline alone (D = 1, also after packing), the live group
    serves. Should packing leave a replica-0 pipeline with no group of its own, every
    live rank takes part in the gather instead and keeps replica 0's entries.
    (``use_local_synchronization=True`` groups would avoid this but hang on gloo with
    three ranks in torch 2.13.)
    """

    def __init__(self) -> None:
        self.key: tuple[int, ...] | None = None
        self.group = None

    def pipeline(self, rank: int, replica: int, first_block: int, live_group=None):
        """(ranks, first blocks) of replica 0's stages in model order, and the sorted
        live ranks (collective over ``live_group``)."""
        me = torch.tensor([replica, first_block, rank], dtype=torch.int64)
        info = all_gather_var(me, live_group)
        rep0 = sorted((int(t[1]), int(t[2])) for t in info if int(t[0]) == 0)
        return [r for _, r in rep0], [f for f, _ in rep0], sorted(int(t[2]) for t in info)

    def prepare(self, rank: int, replica: int, first_block: int) -> None:
        """Make replica 0's pipeline group (collective over the whole world, once)."""
        ranks, _, live = self.pipeline(rank, replica, first_block)
        if 1 < len(ranks) < len(live):
            self.key = tuple(sorted(ranks))
            self.group = dist.new_group(list(self.key))

    def gather_fn(self, ranks: list[int], live: list[int], live_group=None):
        """(``gather(t)`` giving every replica-0 stage's ``t`` in model order, whether
        every live rank must call it) for this pruning step."""
        key = tuple(sorted(ranks))
        if len(ranks) == 1:  # one stage: nothing to gather; other replicas get the broadcast
            return (lambda t: [t.reshape(-1)]), False
        if key == tuple(live):
            group, members, everyone = live_group, key, False
        elif key == self.key:
            group, members, everyone = self.group, key, False
        else:
            group, members, everyone = live_group, tuple(live), True

        def gather(t: torch.Tensor) -> list[torch.Tensor]:
            got = all_gather_var(t, group)  # group ranks are the sorted global ranks
            return [got[members.index(r)] for r in ranks]

        return gather, everyone


def broadcast_masks(masks: dict[str, torch.Tensor], src: int, group) -> dict[str, torch.Tensor]:
    """``src``'s masks (same names and shapes on every member) on every member."""
    if group is None or not masks:
        return masks
    flat = torch.cat([m.reshape(-1) for m in masks.values()]).to(torch.uint8)
    dist.broadcast(flat, src=src, group=group)
    out, at = {}, 0
    for n, m in masks.items():
        out[n] = flat[at : at + m.numel()].view(m.shape).bool()
        at += m.numel()
    return out
