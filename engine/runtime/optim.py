"""Optimizer, learning-rate schedule and gradient synchronisation of one stage.

The learning rate is a pure function of the step, so a resumed run needs no scheduler
state. Gradients are summed (each micro-batch loss is already weighted by m / B) over
the stage's data-parallel replicas in one flat bucket per group; a tied weight's two
halves (first and last stage) are summed over the group that joins both stages.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from jobctl.engine.model.blocks import Tie
from jobctl.engine.runtime.topology import Topology
from jobctl.spec.sections import TrainingSpec


def build_optimizer(params: list[nn.Parameter], training: TrainingSpec) -> torch.optim.Optimizer:
    """The optimizer a spec's ``training`` section asks for."""
    t = training
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay, foreach=False)


def lr_at(step: int, training: TrainingSpec) -> float:
    """Learning rate of optimizer step ``step`` (0-based)."""
    t = training
    if t.warmup_steps and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if t.lr_schedule == "cosine":
        span = max(1, t.steps - t.warmup_steps)
        progress = min(1.0, (step - t.warmup_steps) / span)
        return t.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def tied_names(ties: list[Tie]) -> set[str]:
    """Parameter names whose gradient is summed over the tied group."""
    return {n for t in ties for n in (t.canonical, t.alias)}


def sync_gradients(
    named: dict[str, nn.Parameter],
    topo: Topology,
    ties: set[str],
    groups: list[Tie] = (),
    shapes: dict[str, tuple] | None = None,
) -> None:
    """Sum gradients over data-parallel replicas (and tied stages) in flat buckets.

    A tied tensor may have several copies on one rank (a traced model's subgraphs each
    hold the tensor they read, e.g. T5's shared embedding in two decoder subgraphs):
    each rank adds its copies' gradients per tie, the sums are all-reduced over the
    tied stages, and every copy takes the total. ``shapes`` gives a tie's shape for a
    rank that holds none of its copies but takes part in the group.
    """
    tied_here = topo.tied_group is not None
    dp: list[nn.Parameter] = []
    for name, p in named.items():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if not (tied_here and name in ties):
            dp.append(p)
    allreduce_grads(dp, topo.dp_group)
    if tied_here and groups:
        _sync_ties(named, topo, groups, shapes or {})
    elif tied_here:  # names only: one copy per rank, summed as one bucket
        allreduce_grads([p for n, p in named.items() if n in ties], topo.tied_group)


def _sync_ties(named: dict, topo: Topology, groups: list[Tie], shapes: dict) -> None:
    copies: dict[str, dict[int, nn.Parameter]] = {}
    for t in groups:
        for n in (t.canonical, t.alias):
            if n in named:
                copies.setdefault(t.canonical, {})[id(named[n])] = named[n]
            else:
                copies.setdefault(t.canonical, {})
    sums = []
    for key in sorted(copies):
        held = list(copies[key].values())
        if held:
            sums.append(torch.stack([p.grad for p in held]).sum(0))
        else:
            sums.append(torch.zeros(shapes[key], device=next(iter(named.values())).device))
    flat = _flatten_dense_tensors(sums)
    dist.all_reduce(flat, group=topo.tied_group)
    for key, total in zip(sorted(copies), _unflatten_dense_tensors(flat, sums), strict=True):
        for p in copies[key].values():
            p.grad.copy_(total)


def allreduce_grads(params: list[nn.Parameter], group) -> None:
    """Sum ``params``' gradients over ``group`` in one flat bucket (copied out and back)."""
    if not params or group is None:
        return
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(synced)
