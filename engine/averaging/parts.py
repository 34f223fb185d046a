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
        stage = Stage(mdef, me.blocks, me.keep_blocks).to(device)
        if state.tp is not None:  # T > 1: each copy split as model 0 is (same shapes)
            state.tp.apply(stage)
        return stage

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
