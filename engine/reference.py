"""Single-process reference training: the semantics every parallel layout must keep.

The whole model in one process, the same blocks, data order, loss weighting (m / B per
micro-batch) and optimizer. Parity tests compare the pipeline runtime against this; it
is also the definition of "the same training" that morphing and rebalancing preserve.
"""

from __future__ import annotations

import torch

from .data import Sharding, make_data
from .model import Stage, lm_loss, model_def
from .optim import build_optimizer, lr_at, set_lr


def reference_train(
    spec,
    steps: int | None = None,
    micro_batch: int | None = None,
    start_state: dict[str, torch.Tensor] | None = None,
    start_step: int = 0,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train the spec's model in one process; returns per-step losses and final weights.

    ``start_state`` (parameters by unsplit name) and ``start_step`` continue from a
    checkpoint's weights; the optimizer state then starts fresh, so use it only for
    comparisons that expect that.
    """
    torch.manual_seed(spec.training.seed)
    mdef = model_def(spec.model, spec.training.seed)
    model = Stage(mdef, range(mdef.num_blocks))
    if start_state:
        model.load_state_dict(start_state, strict=False)
    params = dict(model.named_parameters())
    opt = build_optimizer(list(params.values()), spec.training)
    B = spec.training.global_batch_size
    m = micro_batch or B
    shard = Sharding(B, 1, m)
    data = make_data(spec)
    losses = []
    for step in range(start_step, steps if steps is not None else spec.training.steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(shard.micro_batches):
            x, y = data.batch(shard.first_sample(step, 0, i), m)
            loss = lm_loss(model(x), y) * shard.loss_scale
            loss.backward()
            total += float(loss.detach())
        set_lr(opt, lr_at(step, spec.training))
        opt.step()
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
