"""How a worker puts its trainer together: the event sink, the rank's stage, and the
plug-ins (pruning and rebalancing where the spec turns them on, checkpointing always),
handed to the trainer as hooks."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.averaging.checkpoint import ElasticCheckpointing, resume_elastic
from jobctl.engine.averaging.parts import elastic_parts
from jobctl.engine.averaging.trainer import ElasticTrainer
from jobctl.engine.channel.client import event_sink
from jobctl.engine.checkpoint.hook import Checkpointing, resume_stage
from jobctl.engine.core.env import CHAOS
from jobctl.engine.core.events import EventLog
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import ModelDef, model_def
from jobctl.engine.pruning.hook import PruningHook
from jobctl.engine.pruning.pruner import Pruner
from jobctl.engine.rebalance.hook import Rebalancer
from jobctl.engine.runtime.hook import StageState, StepHook
from jobctl.engine.runtime.trainer import Trainer, build_state
from jobctl.engine.worker.chaos import ChaosKill, parse
from jobctl.engine.worker.mobius import MobiusTrainer
from jobctl.engine.worker.timeline import mark
from jobctl.spec.job import JobSpec


def _pruner(spec: JobSpec, state: StageState, mdef: ModelDef, events: EventLog) -> Pruner:
    """This rank's pruner over its stage (collective: every rank builds one)."""
    return Pruner(
        spec,
        state.stage,
        state.named,
        state.opt,
        state.topo,
        mdef.ties,
        events,
        micro_batch=state.plan.micro_batch_size,
    )


def build_trainer(
    spec: JobSpec,
    plan: Plan,
    run_dir: Path,
    rank: int,
    device: torch.device,
    resume: Path | None = None,
) -> Trainer:
    """The trainer of ``rank``, with its hooks; from checkpoint ``resume`` if given."""
    if plan.mobius is not None:  # S stages swapped through the tier (worker.mobius)
        return MobiusTrainer(spec, plan, run_dir, rank, device, resume)  # type: ignore[return-value]
    # The run's channel (with liveness pings from this rank's node), else metrics.jsonl.
    events = event_sink(run_dir, rank, plan.rank(rank).node)
    mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
    state = build_state(mdef, spec.training, plan, rank, device)
    parts = elastic_parts(spec, mdef, state, device)  # AvgPipe's N models, or None
    pruner = _pruner(spec, state, mdef, events) if spec.pruning.enabled else None
    hooks: list[StepHook] = [] if pruner is None else [PruningHook(pruner)]
    if spec.rebalancing.enabled:
        hooks.append(Rebalancer(spec, mdef, device, events, run_dir, pruner))
    masks = None if pruner is None else (lambda: pruner.masks)
    args = (spec, plan, rank, run_dir, events, mdef.ties, masks)
    checkpoints = Checkpointing(*args) if not parts else ElasticCheckpointing(*args, parts=parts)
    hooks.append(checkpoints)
    aim = parse(os.environ[CHAOS], rank) if os.environ.get(CHAOS) else None
    if aim is not None and resume is None:  # chaos tests: kill the node, first attempt only
        hooks.append(ChaosKill(*aim))
    start = 0
    mark("model")  # the state is built; what follows to "built" is mostly the resume
    if resume is not None and parts:
        start = resume_elastic(parts, plan.global_batch_size, mdef.ties, resume)
    elif resume is not None:
        start = resume_stage(state, mdef.ties, resume)
        if pruner is not None:
            pruner.load(resume, start)
    checkpoints.clear_stale_staging()
    dist.barrier()  # nobody stages before stale staging folders are gone
    if parts:
        return ElasticTrainer(spec, mdef, state, device, events, hooks, start, parts=parts)
    return Trainer(spec, mdef, state, device, events, hooks, start)
