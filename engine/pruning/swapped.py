"""DynPipe's gradual magnitude pruning over Mobius's swapped stages.

A Mobius rank's stages live in records in the tier, not in modules (``mobius``), so
this is the :class:`~jobctl.engine.pruning.hook.PruningHook`'s pruner there. At a
pruning step the pending update is applied first (the weights of the step before),
every rank offers the weights of all its stages (non-contiguous blocks: stage j on
rank j % N), Alg. 2 selects over the N ranks exactly as over a pipeline (ties at the
threshold in the model's block order, ``selection``), a tied alias takes its
canonical's mask, and ``mobius.masks.hold`` zeroes what is pruned in every record;
each later update on upload keeps it zero. The ``pruning`` record is the resident
pruner's. The step after is not profiled per block: Mobius runs no rebalancing, which
is what the profile feeds.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.checkpoint.blocks import load_masks
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.mobius.masks import held, hold
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.model.blocks import Tie
from jobctl.engine.pruning.comm import all_gather_var, world
from jobctl.engine.pruning.pruner import block_sparsity, layer_sparsity, summarize
from jobctl.engine.pruning.schedule import target_at
from jobctl.engine.pruning.selection import pair_selected, prunable_names, select_masks
from jobctl.spec.phases import PruningSpec


class SwappedPruner:
    """The masks of a Mobius rank's stages and the collective pruning step."""

    def __init__(
        self, cfg: PruningSpec, runner: MobiusRunner, ties: list[Tie], events: EventLog | None
    ):
        self.cfg, self.runner, self.ties, self.events = cfg, runner, ties, events
        self.group = runner.links.group
        self.reporter = runner.placement[-1] == runner.cfg.rank  # holds the last stage

    def maybe_prune(self, step: int) -> dict | None:
        """Prune if ``step`` (optimizer steps done) is a pruning step; collective."""
        target = target_at(self.cfg, step) if self.cfg.enabled else None
        if target is None:
            return None
        self.runner.flush()  # select on the weights after step `step`'s update
        weights = self.runner.weights()
        names = prunable_names(list(weights), self.cfg.prunable, self.ties)
        gather = lambda t: all_gather_var(t, self.group)  # noqa: E731
        masks, k, total, tau = select_masks({n: weights[n] for n in names}, target, gather)
        summary = summarize(masks, k, total, tau, gather)
        masks.update(self._alias_masks(masks, weights, gather))
        hold(self.runner, masks)
        return self._report(step, target, summary, masks)

    def _alias_masks(self, masks: dict, weights: dict, gather) -> dict:
        """Each pruned canonical's mask for its alias, wherever the two stages are."""
        out = {}
        for tie in self.ties:  # every rank walks every tie, in the same order
            if not pair_selected(tie, self.cfg.prunable):
                continue
            mine = masks.get(tie.canonical)
            offer = torch.zeros(0, dtype=torch.uint8) if mine is None else mine.to(torch.uint8)
            got = next((g for g in gather(offer.reshape(-1)) if g.numel()), None)
            if got is not None and tie.alias in weights:
                out[tie.alias] = got.view(weights[tie.alias].shape).bool()
        return out

    def _report(self, step: int, target: float, summary: dict, masks: dict) -> dict:
        """The ``pruning`` record (every rank's stages), written by the last stage's rank."""
        mine = (block_sparsity(masks), layer_sparsity(masks))
        every = [mine]
        if world(self.group) > 1:
            every = [None] * world(self.group)
            dist.all_gather_object(every, mine, group=self.group)
        rec = {"step": step, "target_sparsity": target, **summary}
        rec["block_sparsity"] = dict(sorted(b for bs, _ in every for b in bs.items()))
        rec["layer_sparsity"] = {n: s for _, ls in every for n, s in ls.items()}
        if self.events is not None and self.reporter:
            self.events.write(Kind.PRUNING, **rec)
        return rec

    def mask_grads(self) -> None:
        """Nothing: each update on upload masks its stage (``mobius.masks``)."""

    def after_step(self) -> None:
        """Nothing: each update on upload re-zeroes its stage's pruned weights."""

    def profile_step(self, step: int):
        return contextlib.nullcontext()

    def checkpoint_masks(self) -> dict[str, torch.Tensor]:
        """The masks a checkpoint saves with this rank's blocks."""
        return held(self.runner)

    def load(self, ckpt_dir: Path, step: int) -> None:
        """Masks from a checkpoint (any layout's) into this rank's records."""
        names = [s.name for lay in self.runner.layouts.values() for s in lay.spans]
        masks = load_masks(ckpt_dir, names, self.ties)
        if masks:
            hold(self.runner, masks)
