"""Global magnitude selection (DynPipe Alg. 2), in pieces a pipeline can run apart.

Pruning to sparsity ``s`` removes the ``k = round(s N)`` smallest-magnitude elements of
all ``N`` prunable elements of the model. No rank ever holds the model: each stage
offers its local ``k`` smallest magnitudes (the global ``k`` smallest are among them),
the candidates of all stages are gathered, and the ``k``-th smallest of them is the
global threshold ``tau``. Past 50 % sparsity the shorter list is offered instead: each
stage's ``N - k + 1`` largest, of which the ``(N - k + 1)``-th largest is ``tau``.
Everything below ``tau`` is pruned; elements equal to ``tau`` are pruned in model order
(block, parameter, flat index) until ``k`` are gone, so the result is exactly that of
sorting the assembled model, ties included. Masks are ``True`` where a weight is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Params = dict[str, torch.Tensor]  # in model order


def count_to_prune(sparsity: float, total: int) -> int:
    """Elements to prune for ``sparsity`` of ``total`` (round half up)."""
    return min(total, max(0, math.floor(sparsity * total + 0.5)))


def magnitudes(params: Params) -> torch.Tensor:
    """All elements' |w| in model order, as one flat float32 tensor."""
    if not params:
        return torch.empty(0)
    return torch.cat([p.detach().reshape(-1).abs().float() for p in params.values()])


def smallest(flat: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` smallest values of ``flat`` (all of them if it has fewer), ascending."""
    k = min(k, flat.numel())
    if k == 0:
        return flat.new_empty(0)
    return torch.topk(flat, k, largest=False, sorted=True).values


def largest(flat: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` largest values of ``flat`` (all of them if it has fewer)."""
    m = min(m, flat.numel())
    if m == 0:
        return flat.new_empty(0)
    return torch.topk(flat, m, largest=True, sorted=False).values


def threshold(candidates: list[torch.Tensor], k: int) -> float:
    """The ``k``-th smallest value over all stages' candidates (``k >= 1``)."""
    merged = torch.cat([c.reshape(-1) for c in candidates])
    if k < 1 or k > merged.numel():
        raise ValueError(f"cannot pick the {k}-th smallest of {merged.numel()} candidates")
    return float(torch.kthvalue(merged, k).values)


def below_equal(params: Params, tau: float) -> tuple[int, int]:
    """How many elements are below ``tau`` and exactly equal to it."""
    flat = magnitudes(params)
    return int((flat < tau).sum()), int((flat == tau).sum())


def keep_masks(params: Params, tau: float | None, prune_equal: int) -> dict[str, torch.Tensor]:
    """Masks pruning every |w| < tau and the first ``prune_equal`` elements with |w| == tau."""
    masks: dict[str, torch.Tensor] = {}
    left = prune_equal
    for name, p in params.items():
        if tau is None:
            masks[name] = torch.ones_like(p, dtype=torch.bool)
            continue
        a = p.detach().abs().float()
        pruned = a < tau
        if left > 0:
            equal = (a == tau).reshape(-1).nonzero().reshape(-1)[:left]
            pruned.view(-1)[equal] = True
            left -= equal.numel()
        masks[name] = ~pruned
    return masks


def equal_share(k: int, below: list[int], equal: list[int], me: int) -> int:
    """How many of stage ``me``'s elements equal to tau it prunes (stages in model order)."""
    need = k - sum(below) - sum(equal[:me])
    return max(0, min(equal[me], need))


GatherFn = Callable[[torch.Tensor], list[torch.Tensor]]


def select_masks(params: Params, sparsity: float, gather: GatherFn, me: int):
    """Alg. 2 for one stage: ``gather(t)`` returns every stage's ``t`` in model order and
    ``me`` is this stage's position. Returns (masks, k, total, tau)."""
    counts = gather(torch.tensor([sum(p.numel() for p in params.values())], dtype=torch.int64))
    total = int(sum(int(c) for c in counts))
    if total == 0:
        raise ValueError(
            "pruning.prunable matches no parameter of the model; fix the globs "
            "(names look like 'layers.2.attn.qkv.weight') or set pruning.enabled: false"
        )
    k = count_to_prune(sparsity, total)
    if k == 0:
        return keep_masks(params, None, 0), 0, total, None
    flat = magnitudes(params)
    rest = total - k + 1  # the k-th smallest is the (total - k + 1)-th largest
    if k <= rest:
        tau = threshold(gather(smallest(flat, k)), k)
    else:  # offer the shorter list: each stage's `rest` largest
        offers = torch.cat([c.reshape(-1) for c in gather(largest(flat, rest))])
        tau = threshold([offers], offers.numel() - rest + 1)
    be = gather(torch.tensor(below_equal(params, tau), dtype=torch.int64))
    below, equal = [int(x[0]) for x in be], [int(x[1]) for x in be]
    return keep_masks(params, tau, equal_share(k, below, equal, me)), k, total, tau


def select_single(params: Params, sparsity: float):
    """The assembled-model reference: the whole model is one stage."""
    return select_masks(params, sparsity, lambda t: [t], 0)
