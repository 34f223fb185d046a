"""What elastic averaging adds to one rank, built from the spec and the rank's stage."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jobctl.engine.averaging.config import AveragingConfig
from jobctl.engine.averaging.models import ParallelModel, parallel_models, reference_stage
from jobctl.engine.averaging.reference import ReferenceModel
from jobctl.engine.data.dataset import Sharding
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.runtime.hook import StageState
from jobctl.engine.runtime.two_stage import RankStages, rank_stages
from jobctl.spec.job import JobSpec


@dataclass
class AveragingParts:
    """Its config, the N parallel models (model 0 is the trainer's stage) and the
    reference with its thread."""

    config: AveragingConfig
    models: list[ParallelModel]
    reference: ReferenceModel


def averaging_parts(
    spec: JobSpec, mdef: ModelDef, state: StageState, device: torch.device
) -> AveragingParts | None:
    """The parallel models and reference of ``state``'s stage; None without averaging."""
    config = AveragingConfig.from_spec(spec.parallelism)
    if config is None:
        return None
    me, plan = state.plan.stage_of(state.topo.rank), state.plan
    shard = Sharding(plan.global_batch_size, plan.D, plan.micro_batch_size)

    def make_stage() -> Stage:
        if isinstance(state.stage, RankStages):  # a V rank: its two stages, again
            whole = rank_stages(mdef, plan, state.topo.rank, state.stage.topos).to(device)
            parts = whole.parts
        else:
            whole = Stage(mdef, me.blocks, me.keep_blocks).to(device)
            parts = [whole]
        for part in parts if state.tp is not None else []:  # T > 1: split as model 0
            state.tp.apply(part)
        return whole  # type: ignore[return-value]

    models = parallel_models(state.stage, state.opt, make_stage, spec.training, shard, config.N)
    reference = ReferenceModel(reference_stage(state.stage, make_stage), config.N)
    return AveragingParts(config, models, reference)


def mirror_averaged(pruner, parts: AveragingParts) -> None:
    """Pruning under averaging: the masks hold on the parallel models 1 .. N-1 (model
    0 is the pruner's own stage) and the reference, which the selection reads once it
    has applied every batch before the pruning step (``pruning.pruner.Pruner.mirror``)."""
    ref = dict(parts.reference.stage.named_parameters())
    copies = [(m.named, m.opt) for m in parts.models[1:]] + [(ref, None)]
    pruner.mirror(copies, source=ref, settle=parts.reference.wait_for)


class Moves:
    """AvgPipe's copies of a stage for a migration (``rebalance.hook.Rebalancer``):
    parallel models 1 .. N-1 and the reference move with model 0, block by block."""

    def __init__(self, parts: AveragingParts, pruner=None) -> None:
        self.parts, self.pruner = parts, pruner

    def settled(self, step: int) -> list:
        """The copies as (stage, optimizer or None), once the reference holds r_step."""
        self.parts.reference.wait_for(step)
        models = [(m.stage, m.opt) for m in self.parts.models[1:]]
        return [*models, (self.parts.reference.stage, None)]

    def adopt(self, stage, named, opt, copies: list, step: int) -> None:
        """The moved stages as the parts (a new reference thread at r_step); the masks
        held on the new copies."""
        *moved, (ref, _, _) = copies
        old = self.parts.models
        models = [ParallelModel(stage, named, opt, old[0].share)]
        for (st, nm, o), m in zip(moved, old[1:], strict=True):
            models.append(ParallelModel(st, nm, o, m.share))
        self.parts.reference.close()
        self.parts.models = models
        self.parts.reference = ReferenceModel(ref, self.parts.config.N, version=step)
        if self.pruner is not None:
            mirror_averaged(self.pruner, self.parts)
