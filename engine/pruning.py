"""Gradual global magnitude pruning of a pipeline stage (DynPipe sec. 3.0.2, Alg. 2).

A :class:`Pruner` lives on every rank. At the schedule's pruning steps all ranks run the
selection together: the global threshold comes from the gathered local candidates of
the stages of replica 0 (padded to one length for ``all_gather``), so every replica
uses the same threshold; replica 0's masks are then broadcast over each stage's
data-parallel group, so every replica ends with identical masks. Masks (``True`` =
kept) are a plain dict keyed by the unsplit parameter name; between pruning steps
they zero the gradients before and the weights after each optimizer step, and pruned
elements' optimizer state is zeroed, so pruned weights stay exactly zero.

A tied pair (embedding / head) is pruned when either name is selected; it counts once
(as its canonical half) and the stage holding the alias receives the canonical's mask.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import load_masks
from .model import Tie
from .pruning_profile import BlockProfiler
from .pruning_schedule import schedule, target_at
from .pruning_select import select_masks
from .pruning_sparse import refresh, use_csr, use_dense

Masks = dict[str, torch.Tensor]


def _world(group=None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def prunable_names(names: list[str], globs: list[str], ties: list[Tie]) -> list[str]:
    """Names (in model order) selected by ``globs``; a tied alias never counts itself."""
    aliases = {t.alias: t.canonical for t in ties}
    partner = {**aliases, **{t.canonical: t.alias for t in ties}}

    def hit(n: str) -> bool:
        return any(fnmatch.fnmatchcase(x, g) for g in globs for x in (n, partner.get(n, n)))

    return [n for n in names if n not in aliases and hit(n)]


class Pruner:
    """Masks of one stage and the collective pruning step (see the module docstring)."""

    def __init__(self, spec, stage, named, opt, topo, ties: list[Tie], events=None):
        self.spec, self.stage, self.named, self.opt, self.topo = spec, stage, named, opt, topo
        self.ties, self.events = ties, events
        self.masks: Masks = {}
        self._pruned: Masks = {}  # ~mask, cached for the per-step masked_fill_
        self.profile_at: int | None = None  # loop step that profiles (the one after pruning)
        self.last_profile: dict | None = None
        self.last_pruning: dict | None = None
        self.sparse: dict[int, list] = {}  # block -> its linear layers now computed in CSR
        self._csr_stale = False  # blocks moved: rebuild the CSR choice after the next step
        self.group = None  # the ranks still training (None: all; packing frees some)

    # -- the per-step path --------------------------------------------------------
    def mask_grads(self) -> None:
        """Zero pruned elements' gradients (before the optimizer step)."""
        for name, pruned in self._pruned.items():
            g = self.named[name].grad
            if g is not None:
                g.masked_fill_(pruned, 0.0)

    @torch.no_grad()
    def after_step(self) -> None:
        """Re-zero pruned weights after the optimizer step (weight decay, momentum) and
        rebuild the CSR copies of blocks computed sparsely."""
        for name, pruned in self._pruned.items():
            self.named[name].masked_fill_(pruned, 0.0)
        if self._csr_stale:
            self._switch_to_csr()
        for layers in self.sparse.values():
            refresh(layers)

    # -- pruning ------------------------------------------------------------------
    def due(self, step: int) -> float | None:
        return target_at(self.spec, step) if self.spec.pruning.enabled else None

    def maybe_prune(self, step: int) -> dict | None:
        """Prune if ``step`` (optimizer steps done) is a pruning step; collective."""
        target = self.due(step)
        if target is None:
            return None
        names = prunable_names(list(self.named), self.spec.pruning.prunable, self.ties)
        params = {n: self.named[n] for n in names}
        gather, me = self._pipeline_gather()
        masks, k, total, tau = select_masks(params, target, gather, me)
        for n, m in masks.items():  # sparsity only grows
            if n in self.masks:
                masks[n] = m & self.masks[n]
        masks = self._agree_over_replicas(masks)
        masks.update(self._alias_masks(masks))
        for n, m in masks.items():
            self.adopt(n, m)
        self.profile_at = step
        self._switch_to_csr()
        self.last_pruning = self._report(step, target, k, total, tau, gather)
        return self.last_pruning

    def _pipeline_gather(self):
        """``gather(t)`` over replica 0's stages in model order, and this stage's position."""
        first = min(self.stage.block_ids, default=1 << 40)
        info = self._all_gather(torch.tensor([self.topo.replica, first], dtype=torch.int64))
        order = sorted((int(t[1]), r) for r, t in enumerate(info) if int(t[0]) == 0)
        ranks = [r for _, r in order]
        me = next(i for i, (f, _) in enumerate(order) if f == first)

        def gather(t: torch.Tensor) -> list[torch.Tensor]:
            got = self._all_gather(t)
            return [got[r] for r in ranks]

        return gather, me

    def _all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """all_gather of 1-D tensors of different lengths: padded to the longest."""
        world = _world(self.group)
        if world == 1:
            return [t.reshape(-1)]
        n = torch.tensor([t.numel()], dtype=torch.int64)
        sizes = [torch.zeros_like(n) for _ in range(world)]
        dist.all_gather(sizes, n, group=self.group)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=t.dtype)
        padded[: t.numel()] = t.reshape(-1)
        out = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(out, padded, group=self.group)
        return [o[: int(s)] for o, s in zip(out, sizes, strict=True)]

    def _agree_over_replicas(self, masks: Masks) -> Masks:
        """Replica 0's masks on every replica of the stage (one flat broadcast)."""
        if self.topo.dp_group is None or not masks:
            return masks
        flat = torch.cat([m.reshape(-1) for m in masks.values()]).to(torch.uint8)
        dist.broadcast(flat, src=self.topo.dp_ranks[0], group=self.topo.dp_group)
        out, at = {}, 0
        for n, m in masks.items():
            out[n] = flat[at : at + m.numel()].view(m.shape).bool()
            at += m.numel()
        return out

    def _alias_masks(self, masks: Masks) -> Masks:
        """Send each pruned canonical's mask to the stage holding its alias."""
        out: Masks = {}
        for tie in self.ties:
            holders = self._all_gather(torch.tensor([int(tie.canonical in masks)]))
            src = next((r for r, h in enumerate(holders) if int(h)), None)
            wants = tie.alias in self.named
            if src is None or _world(self.group) == 1:
                continue
            buf = masks[tie.canonical].to(torch.uint8) if tie.canonical in masks else None
            if buf is None:
                shape = self.named[tie.alias].shape if wants else None
                buf = torch.zeros(shape if shape is not None else (0,), dtype=torch.uint8)
            got = self._all_gather(buf.reshape(-1))  # alias holders take the source's
            if wants:
                out[tie.alias] = got[src].view(self.named[tie.alias].shape).bool()
        return out

    def _report(self, step, target, k, total, tau, gather) -> dict:
        mine = {n: m for n, m in self.masks.items() if n not in {t.alias for t in self.ties}}
        pruned = sum(int((~m).sum()) for m in mine.values())
        size = sum(m.numel() for m in mine.values())
        per_stage = gather(torch.tensor([pruned, size], dtype=torch.int64))
        blocks = self.block_sparsity()
        rec = {
            "step": step,
            "target_sparsity": target,
            "achieved_sparsity": sum(int(s[0]) for s in per_stage) / max(1, total),
            "pruned": sum(int(s[0]) for s in per_stage),
            "k": k,
            "prunable": total,
            "threshold": tau,
            "stage_sparsity": [int(s[0]) / max(1, int(s[1])) for s in per_stage],
        }
        every = [(self.topo.replica, blocks)]
        if _world(self.group) > 1:
            every = [None] * _world(self.group)
            dist.all_gather_object(every, (self.topo.replica, blocks), group=self.group)
        rec["block_sparsity"] = {b: s for rep, bs in every if rep == 0 for b, s in bs.items()}
        if self.events is not None and self.topo.is_reporter:
            self.events.write("pruning", **rec)
        return rec

    def block_sparsity(self) -> dict[int, float]:
        """Fraction of pruned prunable elements per block of this stage."""
        out: dict[int, list[int]] = {}
        for n, m in self.masks.items():
            b = int(n.split(".")[1])
            acc = out.setdefault(b, [0, 0])
            acc[0] += int((~m).sum())
            acc[1] += m.numel()
        return {b: p / max(1, t) for b, (p, t) in sorted(out.items())}

    # -- masks coming and going (checkpoints, migration) ---------------------------
    @torch.no_grad()
    def adopt(self, name: str, mask: torch.Tensor) -> None:
        """Take over ``mask`` for parameter ``name`` (now on this stage); zeroes what it
        prunes in the weight and its optimizer state."""
        p = self.named[name]
        mask = mask.to(device=p.device, dtype=torch.bool).reshape(p.shape)
        self.masks[name] = mask
        self._pruned[name] = ~mask
        p.masked_fill_(self._pruned[name], 0.0)
        for v in self.opt.state.get(p, {}).values():
            if torch.is_tensor(v) and v.shape == p.shape:
                v.masked_fill_(self._pruned[name], 0)

    def _switch_to_csr(self) -> None:
        """Blocks sparser than ``pruning.sparse_threshold`` compute their linears in CSR
        (opt-in: benchmarks/sparse_crossover.py shows where that pays off)."""
        self._csr_stale = False
        limit = self.spec.pruning.sparse_threshold
        if limit is None:
            return
        for layers in self.sparse.values():  # new masks or moved blocks: start over
            use_dense(layers)
        self.sparse = {}
        for b, s in self.block_sparsity().items():
            if s > limit and str(b) in self.stage.layers:
                self.sparse[b] = use_csr(self.stage.layers[str(b)], f"layers.{b}.", self.masks)

    def release(self, block_ids) -> Masks:
        """Drop (and return) the masks of blocks leaving this stage."""
        for b in block_ids:
            if b in self.sparse:
                use_dense(self.sparse.pop(b))
        prefixes = tuple(f"layers.{b}." for b in block_ids)
        gone = {n: m for n, m in self.masks.items() if n.startswith(prefixes)}
        for n in gone:
            del self.masks[n], self._pruned[n]
        return gone

    def rebind(self, named, opt, group=None) -> None:
        """Point at the stage's new parameter dict / optimizer (after layers moved) and the
        group of ranks still training; blocks that arrived switch to CSR after a step."""
        self.named, self.opt, self.group = named, opt, group
        self._csr_stale = self.spec.pruning.sparse_threshold is not None

    def masks_of_block(self, block: int) -> Masks:
        prefix = f"layers.{block}."
        return {n: m for n, m in self.masks.items() if n.startswith(prefix)}

    def load(self, ckpt_dir: Path, step: int) -> None:
        """Masks from a checkpoint (written with the block files) for this stage."""
        for n, m in load_masks(ckpt_dir, list(self.named), self.ties).items():
            self.adopt(n, m)
        if any(t == step for t, _ in schedule(self.spec)) and self.masks:
            self.profile_at = step  # the first step after resuming profiles

    # -- profiling ----------------------------------------------------------------
    def profile_step(self, step: int):
        """Context for loop step ``step``: profiles it if it follows a pruning step."""
        active = self.profile_at is not None and step == self.profile_at
        return BlockProfiler(self, step + 1, active)
