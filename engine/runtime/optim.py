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


def sync_gradients(named: dict[str, nn.Parameter], topo: Topology, ties: set[str]) -> None:
    """Sum gradients over data-parallel replicas (and tied stages) in flat buckets."""
    tied_here = topo.tied_group is not None
    buckets: dict[str, list[nn.Parameter]] = {"dp": [], "tied": []}
    for name, p in named.items():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buckets["tied" if tied_here and name in ties else "dp"].append(p)
    allreduce_grads(buckets["dp"], topo.dp_group)
    allreduce_grads(buckets["tied"], topo.tied_group)


def allreduce_grads(params: list[nn.Parameter], group) -> None:
    """Sum ``params``' gradients over ``group`` in one flat bucket (copied out and back)."""
    if not params or group is None:
        return
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(synced)
