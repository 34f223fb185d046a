"""AvgPipe's update rule (sec. 3.2, steps 1-5) as in-place tensor operations.

For batch t (0-based), parallel model i (of N) with weights w_i and optimizer O_i, and
the reference r_t (the reference after the updates of batches 0 .. t-1):

    (E1)  w_i' = O_i(w_i, g_i)        step 1: the user's optimizer on model i's
                                       gradient g_i (the mean over its share of batch t)
    (E2)  u_i = w_i' - w_i             step 1: the local update
    (E3)  w_i <- (1 - alpha) w_i' + alpha r_t
                                       step 2: dilute with the reference
    (E4)  U = u_0 + u_1 + ... + u_{N-1}
                                       steps 3-4: sent through the queue, accumulated
                                       in the order i = 0 .. N-1
    (E5)  r_{t+1} = r_t + U / N        step 5: normalised and applied

E3 uses r_t, not r_{t+1}: the reference applies batch t's updates while the pipelines
train batch t+1, so a pipeline never waits for it (it waits only if the reference
falls a whole batch behind). Every rank of a data-parallel group sees the same
all-reduced gradients, so its copies of w_i and r stay equal. The rule is
deterministic: E4 sums in a fixed order.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def local_update(after: list[torch.Tensor], before: list[torch.Tensor]) -> list[torch.Tensor]:
    """E2: ``after - before``, written into ``before`` (a copy taken before the step)."""
    for b, a in zip(before, after, strict=True):
        b.neg_().add_(a)
    return before


@torch.no_grad()
def dilute(weights: list[torch.Tensor], reference: list[torch.Tensor], alpha: float) -> None:
    """E3: ``w <- (1 - alpha) w + alpha r`` in place."""
    for w, r in zip(weights, reference, strict=True):
        w.mul_(1.0 - alpha).add_(r, alpha=alpha)


@torch.no_grad()
def accumulate(total: list[torch.Tensor] | None, update: list[torch.Tensor]) -> list[torch.Tensor]:
    """E4: add ``update`` into ``total`` (``update`` itself is the first total)."""
    if total is None:
        return update
    for s, u in zip(total, update, strict=True):
        s.add_(u)
    return total


@torch.no_grad()
def apply_mean(reference: list[torch.Tensor], total: list[torch.Tensor], n: int) -> None:
    """E5: ``r <- r + total / N`` in place."""
    for r, s in zip(reference, total, strict=True):
        r.add_(s.div_(n))


@torch.no_grad()
def squared_distance(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """sum ||w - r||^2 over ``(w, r)`` pairs: how far a model is from the reference
    (the supervisor shows the square root of its sum over the stages)."""
    return float(sum(float(torch.sub(w, r).pow_(2).sum()) for w, r in pairs))
