"""One optimizer step of a stage: the one definition the trainer and the calibration
probe both run, and the dry forward that sizes a pipeline's messages.

A step seeds the RNG from (seed, step, rank), clears the gradients, runs the stage's
action list over all micro-batches, lets the caller sum gradients, and updates the
weights at the step's learning rate; hooks see the update from both sides. Under
fp16 the caller's sum also unscales the gradients and agrees whether any rank saw
an overflow (``runtime.loss_scale``): then every rank skips the update.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from jobctl.engine.core.actions import Action
from jobctl.engine.model.blocks import Stage, block_seed
from jobctl.engine.model.graph import boundary
from jobctl.engine.runtime import rng
from jobctl.engine.runtime.executor import Channels, StepExecutor, StepStats
from jobctl.engine.runtime.hook import StepHook
from jobctl.engine.runtime.optim import lr_at, set_lr
from jobctl.engine.runtime.p2p.gloo import (
    recv_ints,
    recv_meta,
    recv_value,
    send_ints,
    send_meta,
    send_value,
)
from jobctl.engine.runtime.topology import Topology
from jobctl.spec.sections import TrainingSpec


@dataclass
class StepTimes:
    """``time.perf_counter`` marks of one step."""

    start: float
    run_start: float  # seeded, gradients cleared
    run_end: float  # the action list ran
    updated: float  # the optimizer stepped


def step_seed(seed: int, step: int, rank: int) -> int:
    """The RNG seed of ``step`` on ``rank``: dropout is a pure function of (seed, step,
    rank), so runs are reproducible and a resumed run needs no saved RNG state."""
    return block_seed(seed, 1_000_000 + step * 4096 + rank)


def seed_rng(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` for a step on ``device``. On a CPU the CPU generator is
    the only one the step draws from, and seeding it alone is the same stream:
    ``torch.manual_seed`` also queues the seed for every accelerator backend (CUDA,
    XPU, MTIA), each capturing the caller's traceback for its lazy start, which cost a
    CPU worker 1.2-1.5 ms a step (cProfile, benchmarks/runtime/schedule_throughput's 1f1b)."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The compute context of a spec's ``training.precision`` (fp32 master weights and
    gradients either way; fp16 needs the loss scale of ``runtime.loss_scale`` too)."""
    if precision in _HALF:
        return torch.autocast(device.type, dtype=_HALF[precision])
    return contextlib.nullcontext()


_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def train_step(
    ex: StepExecutor,
    actions: list[Action],
    opt: torch.optim.Optimizer,
    training: TrainingSpec,
    step: int,
    rank: int,
    *,
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    sync: Callable[[], bool | None] | None = None,
    hooks: Sequence[StepHook] = (),
) -> tuple[StepStats, StepTimes]:
    """Train loop step ``step``: the action list under ``compute`` (autocast), ``sync``
    (the gradient sum over replicas and tied stages; True: an overflow was found, the
    update is skipped on every rank), then the optimizer update."""
    start = time.perf_counter()
    seed_rng(step_seed(training.seed, step, rank), opt.param_groups[0]["params"][0].device)
    opt.zero_grad(set_to_none=True)
    run_start = time.perf_counter()
    with compute():
        stats = ex.run(actions, step)
    run_end = time.perf_counter()
    skip = bool(sync()) if sync is not None else False
    for hook in hooks:
        hook.before_update()
    set_lr(opt, lr_at(step, training))
    if not skip:
        opt.step()
    for hook in hooks:
        hook.after_update()
    return stats, StepTimes(start, run_start, run_end, time.perf_counter())


def probe_channels(
    stage: Stage,
    topo: Topology,
    micro_batch: int,
    seq_len: int,
    device: torch.device,
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Channels:
    """``probe_output``'s channels."""
    return probe_output(stage, topo, micro_batch, seq_len, device, compute)[0]


def probe_output(
    stage: Stage,
    topo: Topology,
    micro_batch: int,
    seq_len: int,
    device: torch.device,
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[Channels, torch.Tensor]:
    """Propagate activation shapes down the pipeline with one dry forward per stage
    (the stage's channels, and its output for a stage that follows on the same rank).

    A traced model's stages also pass on the layout of the several values their
    carrier holds (``model.graph.boundary``), as autocast decided their dtypes. Each
    stage runs on what the stage before it computed, not on zeros: a carrier may hold
    indices (a mixture-of-experts layer's token permutation, inverted by ``index_put_``
    into ``empty_like``), and zeros there leave memory unset that is then indexed.
    """
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long)
    batch = stage.batch(tokens.to(device), tokens.clone().to(device), 0)
    graph = stage.graph
    if topo.is_first:
        x, in_shape, in_dtype = tokens, None, None
    else:
        in_shape, in_dtype = recv_meta(topo.prev)
        if graph is not None:
            graph.in_boundary = boundary.decode(recv_ints(topo.prev))
        x = recv_value(in_shape, in_dtype, topo.prev)
    with torch.no_grad(), rng.isolated(device), compute():
        out = stage(x.to(device), batch)
    if topo.next is not None:
        send_meta(out, topo.next)
        if graph is not None:
            send_ints(boundary.encode(graph.out_boundary), topo.next)
        send_value(out, topo.next)
    return Channels(in_shape, in_dtype, tuple(out.shape), out.dtype), out
