"""Single-process reference training: the semantics every parallel layout must keep.

The whole model in one process, the same blocks, data order, loss weighting (m / B per
micro-batch) and optimizer. Parity tests compare the pipeline runtime against this; it
is also the definition of "the same training" that morphing and rebalancing preserve.
Under ``training.precision`` bf16/fp16 the forward runs under the trainer's autocast;
fp16 scales the loss with ``torch.amp.GradScaler`` at the spec's ``loss_scale`` (the
rule the pipeline's ``runtime.loss_scale`` applies across its ranks).
"""

from __future__ import annotations

import torch

from jobctl.engine.data.dataset import Sharding, TokenData, make_data
from jobctl.engine.model.blocks import Stage, Tie, model_def
from jobctl.engine.pruning.pruner import prunable_names
from jobctl.engine.pruning.schedule import target_at
from jobctl.engine.pruning.selection import select_single
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr
from jobctl.engine.runtime.step import autocast
from jobctl.spec.job import JobSpec
from jobctl.spec.phases import PruningSpec
from jobctl.spec.sections import TrainingSpec


def reference_train(
    spec: JobSpec,
    steps: int | None = None,
    micro_batch: int | None = None,
    start_state: dict[str, torch.Tensor] | None = None,
    start_step: int = 0,
    masks: dict[str, torch.Tensor] | None = None,
    skipped: list[int] | None = None,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train the spec's model in one process; returns per-step losses and final weights.

    ``start_state`` (parameters by unsplit name) and ``start_step`` continue from a
    checkpoint's weights; the optimizer state then starts fresh, so use it only for
    comparisons that expect that. With ``pruning.enabled`` it prunes as the pipeline
    does (after the optimizer step of each pruning step, on the assembled model); the
    final masks go into ``masks`` if given (and ``masks`` passed in continue a run);
    under fp16 the steps whose update the loss scale skipped go into ``skipped``."""
    torch.manual_seed(spec.training.seed)
    B = spec.training.global_batch_size
    mdef = model_def(spec.model, spec.training.seed, micro_batch or B)
    model = Stage(mdef, range(mdef.num_blocks))
    if start_state:
        model.load_state_dict(start_state, strict=False)
    params = dict(model.named_parameters())
    opt = build_optimizer(list(params.values()), spec.training)
    shard, data = Sharding(B, 1, micro_batch or B), make_data(spec)
    losses, held = [], dict(masks or {})
    scaler = _grad_scaler(spec.training)
    if start_step == 0:
        _prune(spec.pruning, mdef.ties, params, opt, held, 0)
    for step in range(start_step, steps if steps is not None else spec.training.steps):
        scale = scaler.get_scale()  # 1.0 where disabled
        losses.append(_step(model, opt, data, shard, held, step, spec.training, scaler))
        if scaler.get_scale() < scale and skipped is not None:
            skipped.append(step)  # only an overflow lowers the scale
        _prune(spec.pruning, mdef.ties, params, opt, held, step + 1)
    if masks is not None:
        masks.update(held)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _grad_scaler(training: TrainingSpec) -> torch.amp.GradScaler:
    """torch's own loss scaler at the spec's rule (disabled: a no-op, unless fp16)."""
    ls = training.loss_scale
    return torch.amp.GradScaler(
        "cpu",
        init_scale=ls.init_scale,
        growth_factor=ls.growth_factor,
        backoff_factor=ls.backoff_factor,
        growth_interval=ls.growth_interval,
        enabled=training.precision == "fp16",
    )


def _step(
    model: Stage,
    opt: torch.optim.Optimizer,
    data: TokenData,
    shard: Sharding,
    held: dict,
    step: int,
    training: TrainingSpec,
    scaler: torch.amp.GradScaler,
) -> float:
    """One optimizer step over the global batch (pruned elements held at zero); its loss."""
    params = dict(model.named_parameters())
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for i in range(shard.micro_batches):
        first = shard.first_sample(step, 0, i)
        x, y = data.batch(first, shard.micro_batch)
        batch = model.batch(x, y, first)
        with autocast(training.precision, torch.device("cpu")):
            loss = model.loss(model(x, batch), y, batch) * shard.loss_scale
        scaler.scale(loss).backward()
        total += float(loss.detach())
    scaler.unscale_(opt)
    for n, keep in held.items():
        params[n].grad.masked_fill_(~keep, 0.0)
    set_lr(opt, lr_at(step, training))
    scaler.step(opt)
    scaler.update()
    with torch.no_grad():
        for n, keep in held.items():
            params[n].masked_fill_(~keep, 0.0)
    return total


@torch.no_grad()
def _prune(pruning: PruningSpec, ties: list[Tie], params: dict, opt, held: dict, step: int) -> None:
    """Global magnitude pruning of the assembled model if ``step`` is a pruning step."""
    target = target_at(pruning, step) if pruning.enabled else None
    if target is None:
        return
    names = prunable_names(list(params), pruning.prunable, ties)
    new, *_ = select_single({n: params[n] for n in names}, target)
    for n, m in new.items():
        held[n] = m & held[n] if n in held else m
        params[n].masked_fill_(~held[n], 0.0)
        for v in opt.state.get(params[n], {}).values():
            if torch.is_tensor(v) and v.shape == m.shape:
                v.masked_fill_(~held[n], 0)
