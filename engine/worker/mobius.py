"""A rank of a ``parallelism.schedule: mobius`` run (a plan with ``Plan.mobius``), put
together for the one loop: ``runtime.trainer.Trainer`` over a
``mobius.engine.SwappedEngine`` whose ``mobius.runtime.MobiusRunner`` swaps this rank's
stages through the tier below device memory (files under ``<run>/mobius/rank-<r>/`` on
a CPU device, pinned host memory on CUDA, held to ``hardware.memory_gb`` per process),
with the same events, stop protocol and checkpoint hook (the block format:
``mobius.checkpoint``) as every other run, pruning's hook where the spec turns it
on (``pruning.swapped``) and rebalancing's after it (``rebalance.swapped``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.core.events import EventLog
from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import make_data, make_eval_data
from jobctl.engine.mobius import checkpoint as mobius_checkpoint
from jobctl.engine.mobius.engine import SwappedEngine
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import model_def
from jobctl.engine.pruning.hook import PruningHook
from jobctl.engine.pruning.swapped import SwappedPruner
from jobctl.engine.rebalance.swapped import SwappedRebalancer
from jobctl.engine.runtime.hook import StepHook
from jobctl.engine.runtime.loss_scale import loss_scaler
from jobctl.engine.runtime.trainer import Trainer
from jobctl.spec.job import JobSpec

#: hardware.memory_gb's unit (the planner's GB).
GB = 1024**3


def swap_config(spec: JobSpec, plan: Plan, run_dir: Path, rank: int) -> SwapConfig:
    """This rank's ``SwapConfig`` from the plan's Mobius record."""
    lay = plan.mobius
    assert lay is not None
    return SwapConfig(
        run_dir / "mobius",
        tuple(tuple(s) for s in lay.stages),
        plan.micro_batch_size,
        prefetch=lay.prefetch,
        budget_bytes=int(spec.hardware.memory_gb * GB),
        rank=rank,
        world=lay.N,
        placement=tuple(lay.ranks),
    )


def build_mobius(
    spec: JobSpec,
    plan: Plan,
    run_dir: Path,
    rank: int,
    device: torch.device,
    events: EventLog,
    hooks: list[StepHook],
    resume: Path | None,
) -> Trainer:
    """The trainer of a Mobius rank: ``hooks`` (chaos) after its checkpoint hook."""
    mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
    cfg = swap_config(spec, plan, run_dir, rank)
    # Boundary tensors travel as CPU tensors (gloo, also under NCCL).
    links = dist.new_group(backend="gloo")
    scaler = loss_scaler(spec.training)  # fp16: one loss scale S for the run
    runner = MobiusRunner(mdef, spec.training, make_data(spec), cfg, device, links, scaler)
    engine = SwappedEngine(runner, plan, rank, device)
    pruner = (
        SwappedPruner(spec.pruning, engine, mdef.ties, events) if spec.pruning.enabled else None
    )
    masks = None if pruner is None else pruner.checkpoint_masks
    args = (spec, plan, rank, run_dir, events, mdef.ties, masks)
    checkpoints = mobius_checkpoint.MobiusCheckpointing(*args, engine=engine)
    start = 0
    if resume is not None:
        start = mobius_checkpoint.resume(runner, mdef.ties, plan.global_batch_size, resume)
        if pruner is not None:
            pruner.load(resume, start)
    checkpoints.clear_stale_staging()
    dist.barrier()  # nobody stages before stale staging folders are gone
    eval_data = make_eval_data(spec) if spec.training.eval_every else None
    pruning = [] if pruner is None else [PruningHook(pruner)]
    if pruner is not None and spec.rebalancing.enabled:  # it acts on pruning's profiles
        pruning.append(SwappedRebalancer(spec, mdef, engine, pruner, events, run_dir))
    hooks = [*pruning, checkpoints, *hooks]
    return Trainer(spec.training, engine, events, hooks, start, eval_data)
