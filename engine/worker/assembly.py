"""How a worker puts its trainer together: the event sink, the rank's step engine
(resident stages, AvgPipe's averaged models or Mobius's swapped ones) and the
plug-ins (pruning and rebalancing where the spec turns them on, checkpointing always,
chaos in tests), handed to the one loop as hooks."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.averaging.checkpoint import AveragingCheckpointing, resume_averaged
from jobctl.engine.averaging.engine import AveragingEngine
from jobctl.engine.averaging.parts import Moves, averaging_parts, mirror_averaged
from jobctl.engine.channel.client import event_sink
from jobctl.engine.checkpoint.hook import Checkpointing, resume_stage
from jobctl.engine.core.env import CHAOS
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import make_data, make_eval_data
from jobctl.engine.model.blocks import ModelDef, model_def
from jobctl.engine.pruning.hook import PruningHook
from jobctl.engine.pruning.pruner import Pruner
from jobctl.engine.rebalance.hook import Rebalancer
from jobctl.engine.runtime.engine import EngineConfig, ResidentEngine
from jobctl.engine.runtime.hook import StageState, StepHook
from jobctl.engine.runtime.trainer import Trainer, build_state
from jobctl.engine.worker.chaos import ChaosKill, parse
from jobctl.engine.worker.mobius import build_mobius
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
        tp=state.tp,
    )


def engine_config(spec: JobSpec, plan: Plan) -> EngineConfig:
    """What the step engine reads of the job (the plan decides the rest)."""
    return EngineConfig(
        training=spec.training,
        seq_len=spec.model.seq_len,
        one_machine=spec.hardware.one_machine,
        # The plan's schedule, not the spec's: `schedule: auto` may resolve to varuna.
        opportunistic=plan.schedule == "varuna",
        # The step commit lets survivors hand a step over; only an elastic job with
        # replicas has survivors that can (a lost node takes a stage of a D = 1 job).
        commits=spec.elasticity.enabled and plan.D > 1,
    )


def _chaos(rank: int, resume: Path | None) -> list[StepHook]:
    """Chaos tests: kill the node where ``JOBCTL_CHAOS`` says, first attempt only."""
    aim = parse(os.environ[CHAOS], rank) if os.environ.get(CHAOS) else None
    return [ChaosKill(*aim)] if aim is not None and resume is None else []


def build_trainer(
    spec: JobSpec,
    plan: Plan,
    run_dir: Path,
    rank: int,
    device: torch.device,
    resume: Path | None = None,
) -> Trainer:
    """The trainer of ``rank``, with its hooks; from checkpoint ``resume`` if given."""
    # The run's channel (with liveness pings from this rank's node), else metrics.jsonl.
    events = event_sink(run_dir, rank, plan.rank(rank).node)
    if plan.mobius is not None:  # S stages swapped through the tier (worker.mobius)
        return build_mobius(spec, plan, run_dir, rank, device, events, _chaos(rank, resume), resume)
    mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
    state = build_state(mdef, spec.training, plan, rank, device)
    if state.tp is not None and state.tp.requested:  # its fallbacks, for the views too
        me = plan.stage_of(rank).index
        events.write(Kind.TP_SUBPIPELINE, rank=rank, stage=me, **state.tp.record())
    parts = averaging_parts(spec, mdef, state, device)  # AvgPipe's N models, or None
    pruner = _pruner(spec, state, mdef, events) if spec.pruning.enabled else None
    if pruner is not None and parts:  # AvgPipe: the masks hold on every copy
        mirror_averaged(pruner, parts)
    hooks: list[StepHook] = [] if pruner is None else [PruningHook(pruner)]
    if spec.rebalancing.enabled:
        moves = Moves(parts, pruner) if parts else None  # AvgPipe's copies move too
        hooks.append(Rebalancer(spec, mdef, device, events, run_dir, pruner, moves))
    masks = None if pruner is None else pruner.checkpoint_masks
    args = (spec, plan, rank, run_dir, events, mdef.ties, masks)
    checkpoints = Checkpointing(*args) if not parts else AveragingCheckpointing(*args, parts=parts)
    hooks += [checkpoints, *_chaos(rank, resume)]
    mark("model")  # the state is built; what follows to "built" is mostly the resume
    start = 0 if resume is None else _resumed(state, parts, pruner, mdef, resume)
    checkpoints.clear_stale_staging()
    dist.barrier()  # nobody stages before stale staging folders are gone
    args = (engine_config(spec, plan), state, mdef, device, make_data(spec))
    engine = ResidentEngine(*args) if not parts else AveragingEngine(*args, parts=parts)
    evals = make_eval_data(spec) if spec.training.eval_every else None
    return Trainer(spec.training, engine, events, hooks, start, evals)


def _resumed(state: StageState, parts, pruner, mdef: ModelDef, resume: Path) -> int:
    """Load checkpoint ``resume`` into this rank's stage (or AvgPipe's models) and its
    pruner; the step to continue at."""
    if parts:
        local = None if state.tp is None else state.tp.local
        start = resume_averaged(parts, state.plan.global_batch_size, mdef.ties, resume, local)
    else:
        start = resume_stage(state, mdef.ties, resume)
    if pruner is not None:
        pruner.load(resume, start)
    return start
