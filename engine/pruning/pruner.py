"""Gradual global magnitude pruning of a pipeline stage (DynPipe sec. 3.0.2, Alg. 2).

A :class:`Pruner` lives on every rank. At the schedule's pruning steps replica 0's
pipeline selects together (its stages gather their local candidates, see
``pruning_comm``); the other replicas, holding the same weights, receive replica 0's
masks over each stage's data-parallel group, so every replica ends with identical
masks. Masks (``True`` = kept) are a plain dict keyed by the unsplit parameter name;
between pruning steps they zero the gradients before and the weights after each
optimizer step, and pruned elements' optimizer state is zeroed, so pruned weights stay
exactly zero.

A tied pair (embedding / head) is pruned when either name is selected; it counts once
(as its canonical half) and the stage holding the alias receives the canonical's mask.

With T > 1 (tensor parallelism) a rank holds a shard of each split parameter. The
selection sees whole weights, as one process does: the T group gathers each prunable
parameter whole (``tp.whole``), shard 0 of each stage selects (the others take part
only in the gathers, like a non-zero replica), its whole masks reach the group's other
shards and then the other replicas, and every rank keeps the shard of each mask that
covers its shard of the weight (``tp.local``). Checkpoints save whole masks, so a run
pruned at T = 2 resumes at any T. Ties at the threshold are broken in the whole
model's order, so the masks are one process's exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from jobctl.engine.checkpoint.blocks import load_masks
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.model.blocks import Stage, Tie
from jobctl.engine.pruning.comm import SelectorGroups, broadcast_masks, world
from jobctl.engine.pruning.crossover import Shape, resolve, shape_key
from jobctl.engine.pruning.profile import BlockProfiler
from jobctl.engine.pruning.schedule import schedule, target_at
from jobctl.engine.pruning.selection import pair_selected, prunable_names, select_masks
from jobctl.engine.pruning.sparse import refresh, use_csr, use_dense
from jobctl.engine.runtime.topology import Topology
from jobctl.spec.job import JobSpec

Masks = dict[str, torch.Tensor]


class Pruner:
    """Masks of one stage and the collective pruning step (see the module docstring)."""

    def __init__(
        self,
        spec: JobSpec,
        stage: Stage,
        named: dict[str, nn.Parameter],
        opt: torch.optim.Optimizer,
        topo: Topology,
        ties: list[Tie],
        events: EventLog | None = None,
        micro_batch: int | None = None,
        tp=None,
    ):
        self.spec, self.stage, self.named, self.opt, self.topo = spec, stage, named, opt, topo
        self.tp = tp  # T > 1: the stage's split (model.graph.tp_stage.StageShards)
        self.micro_batch = micro_batch  # the plan's m (the spec's may be ``auto``)
        self.ties, self.events = ties, events
        self.masks: Masks = {}
        self._pruned: Masks = {}  # ~mask, cached for the per-step masked_fill_
        self.profile_at: int | None = None  # loop step that profiles (the one after pruning)
        self.last_profile: dict | None = None
        self.last_pruning: dict | None = None
        self.sparse: dict[int, list] = {}  # block -> its linear layers now computed in CSR
        self.crossovers: dict[str, float | None] | None = None  # auto: shape -> crossover
        self._csr_stale = False  # blocks moved: rebuild the CSR choice after the next step
        self.group = None  # the ranks still training (None: all; packing frees some)
        self.copies: list[tuple[dict[str, nn.Parameter], torch.optim.Optimizer | None]] = []
        self.source: dict[str, nn.Parameter] | None = None  # selected on (None: named)
        self.settle: Callable[[int], None] | None = None  # waits until `source` is at a step
        self.selectors = SelectorGroups()
        self.selectors.prepare(topo.rank, self.role, min(stage.block_ids))  # collective

    @property
    def role(self) -> int:
        """This rank's replica as the selection sees it: shards t > 0 of a T group
        only receive their shard 0's masks, like a replica other than 0 (-1)."""
        return self.topo.replica if self.topo.t == 0 else -1

    def mirror(self, copies, source=None, settle=None) -> None:
        """Hold every mask on ``copies`` too: (parameters by name, optimizer or None)
        of other copies of this stage (AvgPipe's parallel models and reference); each
        optimizer masks its own step. ``source``: the copy the selection reads, once
        ``settle(step)`` returns."""
        self.copies, self.source, self.settle = list(copies), source, settle
        for named, opt in self.copies:
            if opt is not None:
                opt.register_step_pre_hook(lambda *_, named=named: self._mask_grads_of(named))
                opt.register_step_post_hook(lambda *_, named=named: self._zero_of(named))

    # -- the per-step path --------------------------------------------------------
    def mask_grads(self) -> None:
        """Zero pruned elements' gradients (before the optimizer step)."""
        self._mask_grads_of(self.named)

    def _mask_grads_of(self, named: dict[str, nn.Parameter]) -> None:
        for name, pruned in self._pruned.items():
            g = named[name].grad
            if g is not None:
                g.masked_fill_(pruned, 0.0)

    @torch.no_grad()
    def _zero_of(self, named: dict[str, nn.Parameter]) -> None:
        for name, pruned in self._pruned.items():
            named[name].masked_fill_(pruned, 0.0)

    @torch.no_grad()
    def after_step(self) -> None:
        """Re-zero pruned weights after the optimizer step (weight decay, momentum) and
        rebuild the CSR copies of blocks computed sparsely."""
        self._zero_of(self.named)
        if self._csr_stale:
            self._switch_to_csr()
        for layers in self.sparse.values():
            refresh(layers)

    # -- pruning ------------------------------------------------------------------
    def due(self, step: int) -> float | None:
        return target_at(self.spec.pruning, step) if self.spec.pruning.enabled else None

    def maybe_prune(self, step: int) -> dict | None:
        """Prune if ``step`` (optimizer steps done) is a pruning step; collective."""
        target = self.due(step)
        if target is None:
            return None
        globs = self.spec.pruning.prunable
        names = prunable_names(list(self.named), globs, self.ties)
        aliases = [t.alias for t in self.ties if t.alias in self.named and pair_selected(t, globs)]
        if self.settle is not None:
            self.settle(step)
        source = self.named if self.source is None else self.source
        params = {n: self._whole(n, source[n].detach()) for n in names}  # T: collective
        held = {n: self._whole(n, self.masks[n]) for n in names if n in self.masks}
        first = min(self.stage.block_ids, default=1 << 40)
        sel = self.selectors
        ranks, _, live = sel.pipeline(self.topo.rank, self.role, first, self.group)
        gather, everyone = sel.gather_fn(ranks, live, self.group)
        summary = None
        if self.role == 0 or everyone:  # replica 0's pipeline selects (Alg. 2)
            masks, k, total, tau = select_masks(params, target, gather)
            masks = {n: m & held[n] if n in held else m for n, m in masks.items()}
            summary = summarize(masks, k, total, tau, gather)
            masks.update(self._alias_masks(masks, aliases, gather))
        else:  # filled by shard 0's and replica 0's broadcasts
            shapes = {**{n: p.shape for n, p in params.items()}, **self._shapes_of(aliases)}
            masks = {n: torch.zeros(shapes[n], dtype=torch.bool) for n in names + aliases}
        masks = self._spread({n: masks[n] for n in names + aliases})
        for n, m in masks.items():
            self.adopt(n, self._local(n, m))
        if (
            self.crossovers is None
            and self.spec.pruning.sparse_threshold == "auto"
            and not self.copies
        ):
            self.crossovers = self._crossovers()
        self.profile_at = step
        self._switch_to_csr()
        self.last_pruning = self._report(step, target, summary, masks)
        return self.last_pruning

    def _shapes_of(self, names: list[str]) -> dict[str, torch.Size]:
        return {n: self.named[n].shape for n in names}

    def _spread(self, masks: Masks) -> Masks:
        """The selecting rank's whole masks on every shard of its T group, then on
        every replica (each broadcast over this rank's group of it)."""
        if self.tp is not None:
            masks = broadcast_masks(masks, self.topo.tp_ranks[0], self.topo.tp_group)
        return broadcast_masks(masks, self.topo.dp_ranks[0], self.topo.dp_group)

    def _whole(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """``name``'s whole tensor from this rank's shard (collective over the T group
        where T > 1; masks travel as bytes)."""
        if self.tp is None:
            return local
        if local.dtype == torch.bool:
            return self.tp.whole(name, local.to(torch.uint8)).bool()
        return self.tp.whole(name, local)

    def _local(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``name``'s whole tensor (itself where T = 1)."""
        return whole if self.tp is None else self.tp.local(name, whole)

    def checkpoint_masks(self) -> Masks:
        """The masks a checkpoint saves: whole, under the unsplit names, so any layout
        resumes from them (collective over the T group where T > 1)."""
        return {n: self._whole(n, m) for n, m in self.masks.items()}

    def _alias_masks(self, masks: Masks, aliases: list[str], gather) -> Masks:
        """Within the selecting pipeline: each pruned canonical's mask to its alias' stage."""
        out: Masks = {}
        for tie in self.ties:  # every stage runs every tie, in the same order
            holders = gather(torch.tensor([int(tie.canonical in masks)]))
            src = next((i for i, h in enumerate(holders) if int(h)), None)
            if src is None:
                continue
            empty = torch.zeros(0, dtype=torch.uint8)
            buf = masks[tie.canonical].to(torch.uint8) if tie.canonical in masks else empty
            got = gather(buf.reshape(-1))
            if tie.alias in aliases:
                out[tie.alias] = got[src].view(self.named[tie.alias].shape).bool()
        return out

    def _report(self, step: int, target: float, summary: dict | None, masks: Masks) -> dict:
        """The ``pruning`` record, the same on every rank; the reporter rank writes it.
        Sparsities are of the whole ``masks`` (a T group's shards counted once)."""
        mine = (self.role, self.block_sparsity(masks), self.layer_sparsity(masks), summary)
        every = [mine]
        if world(self.group) > 1:
            every = [None] * world(self.group)
            dist.all_gather_object(every, mine, group=self.group)
        rec = {"step": step, "target_sparsity": target}
        rec.update(next(s for *_, s in every if s is not None))
        rec["block_sparsity"] = {b: s for rep, bs, _, _ in every if rep == 0 for b, s in bs.items()}
        rec["layer_sparsity"] = {n: s for rep, _, ls, _ in every if rep == 0 for n, s in ls.items()}
        if self.events is not None and self.topo.is_reporter:
            self.events.write(Kind.PRUNING, **rec)
        return rec

    def block_sparsity(self, masks: Masks | None = None) -> dict[int, float]:
        """Fraction of pruned prunable elements per block of this stage (of ``masks``;
        by default this rank's own, its shards where T > 1)."""
        return block_sparsity(self.masks if masks is None else masks)

    def layer_sparsity(self, masks: Masks | None = None) -> dict[str, float]:
        """Fraction of pruned elements per masked parameter of this stage (global pruning
        leaves them uneven; ``jobctl plan`` predicts the next run's stage load from it)."""
        return layer_sparsity(self.masks if masks is None else masks)

    # -- masks coming and going (checkpoints, migration) ---------------------------
    @torch.no_grad()
    def adopt(self, name: str, mask: torch.Tensor) -> None:
        """Take over ``mask`` for parameter ``name`` (now on this stage); zeroes what it
        prunes in the weight and its optimizer state, on every copy."""
        p = self.named[name]
        mask = mask.to(device=p.device, dtype=torch.bool).reshape(p.shape)
        self.masks[name] = mask
        self._pruned[name] = ~mask
        for named, opt in [(self.named, self.opt), *self.copies]:
            q = named[name]
            q.masked_fill_(self._pruned[name], 0.0)
            states = {} if opt is None else opt.state.get(q, {})
            for v in states.values():
                if torch.is_tensor(v) and v.shape == q.shape:
                    v.masked_fill_(self._pruned[name], 0)

    def _switch_to_csr(self) -> None:
        """Masked linears compute in CSR where that pays off (``pruning.sparse_threshold``):
        with ``auto``, a layer at or above the measured crossover of its shape class;
        with a number, a layer sparser than it."""
        self._csr_stale = False
        for layers in self.sparse.values():  # new masks or moved blocks: start over
            use_dense(layers)
        self.sparse = {}
        choose = self._csr_choice()
        if choose is None:
            return
        for b in sorted({int(n.split(".")[1]) for n in self.masks}):
            if str(b) in self.stage.layers:
                layers = use_csr(self.stage.layers[str(b)], f"layers.{b}.", self.masks, choose)
                if layers:
                    self.sparse[b] = layers

    def _csr_choice(self):
        """(layer, mask) -> CSR?, or None when everything stays dense."""
        limit = self.spec.pruning.sparse_threshold
        if limit is None or self.copies:  # AvgPipe's pull moves the weights after the
            return None  # step, where a CSR copy is refreshed: it would go stale
        if limit != "auto":
            return lambda mod, mask: _sparsity(mask) > limit
        cross = self.crossovers  # after a resume: what the cache holds, nothing measured
        if cross is None:
            cross = resolve(
                self._shapes(), self._per_step(), device=self._device(), measure_missing=False
            )

        def choose(mod: nn.Linear, mask: torch.Tensor) -> bool:
            x = cross.get(shape_key(self._shape(mod)))
            return x is not None and _sparsity(mask) >= x

        return choose

    def _crossovers(self) -> dict[str, float | None]:
        """Crossover per shape class of the whole model: rank 0 (always live) looks them
        up in the cache or measures the missing ones, and tells every live rank, so all
        replicas of a layer make the same choice (collective over the live ranks)."""
        mine = self._shapes()
        if world(self.group) == 1:
            return resolve(mine, self._per_step(), device=self._device())
        every: list = [None] * world(self.group)
        dist.all_gather_object(every, mine, group=self.group)
        box: list = [None]
        if self.topo.rank == 0:
            box = [resolve(set().union(*every), self._per_step(), device=self._device())]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _micro_batch(self) -> int:
        """The plan's m; without a plan, the spec's (an ``auto`` one taken as 1)."""
        if self.micro_batch is not None:
            return self.micro_batch
        m = self.spec.training.micro_batch_size
        return m if isinstance(m, int) else 1

    def _shape(self, mod: nn.Linear) -> Shape:
        return (mod.out_features, mod.in_features, self.spec.model.seq_len * self._micro_batch())

    def _shapes(self) -> set[Shape]:
        """Shape classes of this stage's prunable linear layers."""
        names = prunable_names(list(self.named), self.spec.pruning.prunable, self.ties)
        mods = [self.stage.get_submodule(n.rpartition(".")[0]) for n in names]
        return {self._shape(m) for m in mods if isinstance(m, nn.Linear)}

    def _per_step(self) -> int:
        """Micro-batches per optimizer step of one replica (the CSR gather amortises)."""
        m = self._micro_batch() * self.topo.D
        return max(1, self.spec.training.global_batch_size // m)

    def _device(self) -> torch.device:
        return next(iter(self.named.values())).device

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

    def load(self, ckpt_dir: Path, step: int) -> None:
        """Masks from a checkpoint (written with the block files) for this stage."""
        for n, m in load_masks(ckpt_dir, list(self.named), self.ties).items():
            self.adopt(n, self._local(n, m))
        self._csr_stale = self.spec.pruning.sparse_threshold is not None and bool(self.masks)
        if any(t == step for t, _ in schedule(self.spec.pruning)) and self.masks:
            self.profile_at = step  # the first step after resuming profiles

    # -- profiling ----------------------------------------------------------------
    def profile_step(self, step: int):
        """Context for loop step ``step``: profiles it if it follows a pruning step."""
        active = self.profile_at is not None and step == self.profile_at
        return BlockProfiler(self, step + 1, active)


def _sparsity(mask: torch.Tensor) -> float:
    return 1.0 - int(mask.sum()) / max(1, mask.numel())


def block_sparsity(masks: Masks) -> dict[int, float]:
    """Fraction of pruned elements per block (``layers.<block>.`` names) of ``masks``."""
    out: dict[int, list[int]] = {}
    for n, m in masks.items():
        acc = out.setdefault(int(n.split(".")[1]), [0, 0])
        acc[0] += int((~m).sum())
        acc[1] += m.numel()
    return {b: p / max(1, t) for b, (p, t) in sorted(out.items())}


def layer_sparsity(masks: Masks) -> dict[str, float]:
    """Fraction of pruned elements per masked parameter."""
    return {n: _sparsity(m) for n, m in masks.items()}


def summarize(masks: Masks, k: int, total: int, tau, gather) -> dict:
    """Global figures of a selection (collective over the selecting stages)."""
    pruned = sum(int((~m).sum()) for m in masks.values())
    size = sum(m.numel() for m in masks.values())
    per_stage = gather(torch.tensor([pruned, size], dtype=torch.int64))
    done = sum(int(s[0]) for s in per_stage)
    return {
        "achieved_sparsity": done / max(1, total),
        "pruned": done,
        "k": k,
        "prunable": total,
        "threshold": tau,
        "stage_sparsity": [int(s[0]) / max(1, int(s[1])) for s in per_stage],
    }
