"""DynPipe's gradual magnitude pruning over Mobius's swapped stages.

A Mobius rank's stages live in records in the tier, not in modules (``mobius``), so
this is the :class:`~jobctl.engine.pruning.hook.PruningHook`'s pruner there. At a
pruning step the pending update is applied first (the weights of the step before),
every rank offers the weights of all its stages (non-contiguous blocks: stage j on
rank j % N), Alg. 2 selects over the N ranks exactly as over a pipeline (ties at the
threshold in the model's block order, ``selection``), a tied alias takes its
canonical's mask, and ``mobius.masks.hold`` zeroes what is pruned in every record;
each later update on upload keeps it zero. The ``pruning`` record is the resident
pruner's. The step after is profiled per block (:class:`SwappedProfiler`: every block
of every stage of the rank, its forward timed twice, as Mobius runs it: once without
a graph, once recomputed in backward), which feeds rebalancing (``rebalance.swapped``).
The pruner reads the runner through the engine, so a re-cut's new runner is its.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.checkpoint.blocks import load_masks
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.mobius.masks import held, hold
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.model.blocks import Tie
from jobctl.engine.pruning.comm import all_gather_var, world
from jobctl.engine.pruning.profile import BlockProfiler
from jobctl.engine.pruning.pruner import block_sparsity, layer_sparsity, summarize
from jobctl.engine.pruning.schedule import schedule, target_at
from jobctl.engine.pruning.selection import pair_selected, prunable_names, select_masks
from jobctl.engine.runtime.vitals import max_rss_mb
from jobctl.spec.phases import PruningSpec


class SwappedProfiler(BlockProfiler):
    """:class:`BlockProfiler` over every block of a Mobius rank's stages."""

    def blocks(self) -> list[tuple[int, torch.nn.Module]]:
        runner = self.pruner.runner
        mods = [runner.mods[j] for j in runner.mine]
        return [(b, mod.layers[str(b)]) for mod in mods for b in mod.block_ids]

    def report(self) -> dict:
        """The ``profile`` event (a Mobius rank hosts stage = its rank's plan stage)."""
        p = self.pruner
        sp, nnz = block_sparsity(held(p.runner)), block_nonzero(p.runner)
        rank = p.runner.cfg.rank
        blocks = {
            str(b): {"fwd_s": self.fwd[b], "bwd_s": self.bwd[b], "sparsity": sp.get(b, 0.0)}
            for b in self.fwd
        }
        records = sum(lay.nbytes for lay in p.runner.layouts.values())
        memory = {"record_bytes": records, "nonzero_params": sum(nnz.values())}
        return {
            "step": self.step,
            "rank": rank,
            "stage": rank,
            "replica": 0,
            "blocks": blocks,
            "nonzero": {str(b): n for b, n in nnz.items()},
            "memory": {**memory, "max_rss_mb": max_rss_mb()},
        }


def block_nonzero(runner: MobiusRunner) -> dict[int, int]:
    """Nonzero elements per block of ``runner``'s stages (a tie's two copies each where
    it computes, as the resident rebalancer counts them), read from the tier a stage's
    weights at a time into one buffer, not every stage's copy at once as
    ``runner.weights()`` holds them. The weights, not the masks: a weight nobody pruned
    may be zero too (a bias initialised so)."""
    out: dict[int, int] = {}
    flat = torch.empty(max(lay.n for lay in runner.layouts.values()))
    for j, lay in runner.layouts.items():
        runner.tier.load(j, flat, [lay.section(0)], ["params"])
        runner.tier.drain()
        for span in lay.spans:
            b = int(span.name.split(".")[1])
            n = int(flat[span.offset : span.offset + span.numel].count_nonzero())
            out[b] = out.get(b, 0) + n
    return dict(sorted(out.items()))


class SwappedPruner:
    """The masks of a Mobius rank's stages and the collective pruning step."""

    def __init__(self, cfg: PruningSpec, engine, ties: list[Tie], events: EventLog | None):  # noqa: ANN001 - a SwappedEngine
        self.cfg, self.engine, self.ties, self.events = cfg, engine, ties, events
        self.profile_at: int | None = None  # loop step that profiles (the one after pruning)
        self.last_profile: dict | None = None

    @property
    def runner(self) -> MobiusRunner:
        return self.engine.runner

    @property
    def group(self):
        return self.runner.links.group

    @property
    def reporter(self) -> bool:
        return self.runner.placement[-1] == self.runner.cfg.rank  # holds the last stage

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
        self.profile_at = step
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

    def profile_step(self, step: int) -> SwappedProfiler:
        """Context for loop step ``step``: profiles it if it follows a pruning step."""
        active = self.profile_at is not None and step == self.profile_at
        return SwappedProfiler(self, step + 1, active)

    def checkpoint_masks(self) -> dict[str, torch.Tensor]:
        """The masks a checkpoint saves with this rank's blocks."""
        return held(self.runner)

    def load(self, ckpt_dir: Path, step: int) -> None:
        """Masks from a checkpoint (any layout's) into this rank's records."""
        names = [s.name for lay in self.runner.layouts.values() for s in lay.spans]
        masks = load_masks(ckpt_dir, names, self.ties)
        if masks:
            hold(self.runner, masks)
            if any(t == step for t, _ in schedule(self.cfg)):
                self.profile_at = step  # the first step after resuming profiles
