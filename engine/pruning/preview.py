"""The pruning schedule of a spec's model in counts, for ``jobctl plan`` (eq. 3.1).

Counts come from the model's parameter shapes, built on the meta device (no memory, no
compute), so a laptop can show the schedule of a model it could never hold.
engine/views/pruning.py renders the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jobctl.engine.model.blocks import model_def
from jobctl.engine.pruning.pruner import prunable_names
from jobctl.engine.pruning.schedule import schedule
from jobctl.engine.pruning.selection import count_to_prune
from jobctl.spec import JobSpec, PruningSpec


def prunable_counts(spec: JobSpec) -> tuple[int, int]:
    """(prunable elements, all parameter elements) of the spec's model."""
    mdef = model_def(spec.model, spec.training.seed)
    shapes: dict[str, int] = {}
    with torch.device("meta"):
        for i in range(mdef.num_blocks):
            for n, p in mdef.block(i).named_parameters():
                shapes[f"layers.{i}.{n}"] = p.numel()
    names = prunable_names(list(shapes), spec.pruning.prunable, mdef.ties)
    aliases = {t.alias for t in mdef.ties}
    total = sum(v for n, v in shapes.items() if n not in aliases)
    return sum(shapes[n] for n in names), total


@dataclass(frozen=True)
class PruningStep:
    """One pruning step: its target sparsity, the prunable elements pruned and kept
    after it, and the share of the still unpruned ones it cuts."""

    step: int
    sparsity: float
    pruned: int
    kept: int
    share: float


@dataclass(frozen=True)
class PruningPreview:
    """The schedule in counts, with the ``pruning`` section it comes from."""

    steps: list[PruningStep]
    prunable: int
    total: int
    pruned_at_end: int  # prunable elements zero at the final sparsity
    pruning: PruningSpec


def preview_pruning(spec: JobSpec) -> PruningPreview:
    """Every pruning step of the spec's schedule, counted on its model."""
    prunable, total = prunable_counts(spec)
    steps, before = [], 0
    for t, s in schedule(spec.pruning):
        k = count_to_prune(s, prunable)
        share = (k - before) / max(1, prunable - before)
        steps.append(PruningStep(t, s, k, prunable - k, share))
        before = k
    end = count_to_prune(spec.pruning.final_sparsity, prunable)
    return PruningPreview(steps, prunable, total, end, spec.pruning)
