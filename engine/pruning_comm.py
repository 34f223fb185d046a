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


def world(group=None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def all_gather_var(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """``all_gather`` of 1-D tensors of different lengths, in group-rank order."""
    n_ranks = world(group)
    if n_ranks == 1:
        return [t.reshape(-1)]
    n = torch.tensor([t.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(n_ranks)]
    dist.all_gather(sizes, n, group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=t.dtype)
    padded[: t.numel()] = t.reshape(-1)
    out = [torch.empty_like(padded) for _ in range(n_ranks)]
    dist.all_gather(out, padded, group=group)
    return [o[: int(s)] for o, s in zip(out, sizes, strict=True)]


class SelectorGroups:
    """Finds replica 0's pipeline (in model order) and keeps a process group for it."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, ...], object] = {}

    def pipeline(self, rank: int, replica: int, first_block: int, live_group=None) -> list[int]:
        """Global ranks of replica 0's stages, ordered by their first block (collective
        over ``live_group``)."""
        me = torch.tensor([replica, first_block, rank], dtype=torch.int64)
        info = all_gather_var(me, live_group)
        return [int(t[2]) for t in sorted(info, key=lambda t: int(t[1])) if int(t[0]) == 0]

    def gather_fn(self, ranks: list[int]):
        """``gather(t)``: every stage's ``t`` in model order (members of ``ranks`` only)."""
        if len(ranks) == 1:
            return lambda t: [t.reshape(-1)]
        key = tuple(sorted(ranks))
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key), use_local_synchronization=True)
        group = self._groups[key]
        where = [key.index(r) for r in ranks]  # group ranks are the sorted global ranks

        def gather(t: torch.Tensor) -> list[torch.Tensor]:
            got = all_gather_var(t, group)
            return [got[i] for i in where]

        return gather


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
