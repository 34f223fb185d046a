"""A single-process reference of AvgPipe's elastic averaging rule, in plain torch.

Written from AvgPipe sec. 3.2 independently of ``jobctl.engine.averaging``: for batch
t, parallel model i computes its gradient on its share of the batch, steps its own
optimizer (local update u_i = w_i' - w_i), dilutes w_i <- (1 - alpha) w_i' + alpha r_t
with the reference r_t of the batches before t, and the reference takes
r_{t+1} = r_t + (u_0 + ... + u_{N-1}) / N. The parity and convergence tests check the
distributed runtime and the statistical efficiency against this. Under fp16 one
``torch.amp.GradScaler`` serves the N optimizers, as its docs show for several
optimizers: each loss scaled before its backward, ``scaler.step`` per optimizer (which
skips one whose gradients overflowed) and one ``scaler.update`` per batch.

With pruning (``prune``: the sparsity to prune to after a number of batches, or None)
the reference is pruned by global magnitude -- the ``k = round(s N)`` smallest |w| of
the prunable weights, ties in model order (a stable sort) -- and the masks hold on
every copy: pruned weights and optimizer state zeroed in the reference and every
parallel model, each model's gradients masked before and weights after its step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

# loss_of(model, t, i) -> model i's mean loss over its share of batch t (a tensor;
# its backward leaves the share's mean gradient).
LossOf = Callable[[nn.Module, int, int], torch.Tensor]


def elastic_train(
    model: nn.Module,
    make_opt: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    loss_of: LossOf,
    n: int,
    alpha: float,
    steps: int,
    scaler: torch.amp.GradScaler | None = None,
    skipped: list[tuple[int, int]] | None = None,
    prune: Callable[[int], float | None] | None = None,
    prunable: Callable[[str], bool] = lambda name: True,
) -> tuple[list[float], nn.Module, list[nn.Module]]:
    """Train N copies of ``model`` elastically; returns the per-step loss (the mean
    over the N models), the reference and the parallel models. With a ``scaler``
    (fp16), the (step, model) pairs whose update it skipped go into ``skipped``."""
    reference = copy.deepcopy(model)
    models = [copy.deepcopy(model) for _ in range(n)]
    opts = [make_opt(list(m.parameters())) for m in models]
    losses, masks = [], {}
    for t in range(steps):
        if prune is not None and prune(t) is not None:
            masks = _pruned(reference, models, opts, prune(t), prunable)
        total, updates = 0.0, []
        for i, (m, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(m, t, i)
            (loss if scaler is None else scaler.scale(loss)).backward()
            total += float(loss.detach()) / n
            before = [p.detach().clone() for p in m.parameters()]
            _apply(masks, m, grads=True)
            opt.step() if scaler is None else scaler.step(opt)
            _apply(masks, m)
            with torch.no_grad():
                updates.append([p - b for p, b in zip(m.parameters(), before, strict=True)])
                if skipped is not None and not any(u.any() for u in updates[-1]):
                    skipped.append((t, i))  # GradScaler skipped the step (an overflow)
                for p, r in zip(m.parameters(), reference.parameters(), strict=True):
                    p.copy_((1 - alpha) * p + alpha * r)
        with torch.no_grad():
            for k, r in enumerate(reference.parameters()):
                acc = updates[0][k].clone()
                for u in updates[1:]:
                    acc += u[k]
                r += acc / n
        if scaler is not None:
            scaler.update()
        losses.append(total)
    return losses, reference, models


@torch.no_grad()
def _pruned(reference, models, opts, sparsity: float, prunable) -> dict[str, torch.Tensor]:
    """Global magnitude masks of the reference (True: kept), zeroed on every copy."""
    named = [(k, p) for k, p in reference.named_parameters() if prunable(k)]
    flat = torch.cat([p.abs().reshape(-1) for _, p in named])
    k = int(sparsity * flat.numel() + 0.5)
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[torch.sort(flat, stable=True).indices[:k]] = False
    masks, at = {}, 0
    for name, p in named:
        masks[name] = keep[at : at + p.numel()].view(p.shape)
        at += p.numel()
    for m, opt in [(reference, None), *zip(models, opts, strict=True)]:
        _apply(masks, m)
        for name, p in m.named_parameters():
            state = {} if opt is None or name not in masks else opt.state.get(p, {})
            for v in state.values():
                if torch.is_tensor(v) and v.shape == p.shape:
                    v.mul_(masks[name])
    return masks


@torch.no_grad()
def _apply(masks: dict[str, torch.Tensor], model: nn.Module, grads: bool = False) -> None:
    """Zero the pruned weights of ``model`` (or, with ``grads``, their gradients)."""
    for name, p in model.named_parameters():
        if name in masks:
            t = p.grad if grads else p
            if t is not None:
                t.mul_(masks[name])


def sync_train(
    model: nn.Module,
    make_opt: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    loss_of: Callable[[nn.Module, int], torch.Tensor],
    steps: int,
) -> tuple[list[float], nn.Module]:
    """Synchronous training of ``model`` on the whole batch of each step."""
    model = copy.deepcopy(model)
    opt = make_opt(list(model.parameters()))
    losses = []
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, t)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model
