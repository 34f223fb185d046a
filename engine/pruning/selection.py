"""Global magnitude selection (DynPipe Alg. 2), in pieces a pipeline can run apart.

Pruning to sparsity ``s`` removes the ``k = round(s N)`` smallest-magnitude elements of
all ``N`` prunable elements of the model. No rank ever holds the model: each stage
offers its local ``k`` smallest magnitudes (the global ``k`` smallest are among them),
the candidates of all stages are gathered, and the ``k``-th smallest of them is the
global threshold ``tau``. Past 50 % sparsity the shorter list is offered instead: each
stage's ``N - k + 1`` largest, of which the ``(N - k + 1)``-th largest is ``tau``.
Everything below ``tau`` is pruned; elements equal to ``tau`` are pruned in model order
(block, parameter, flat index) until ``k`` are gone, so the result is exactly that of
sorting the assembled model, ties included, whichever blocks each stage holds. Masks
are ``True`` where a weight is kept.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable

import torch

from jobctl.engine.model.blocks import Tie

Params = dict[str, torch.Tensor]  # in model order


def prunable_names(names: list[str], globs: list[str], ties: list[Tie]) -> list[str]:
    """Names (in model order) selected by ``globs``; a tied alias never counts itself."""
    aliases = {t.alias: t.canonical for t in ties}
    partner = {**aliases, **{t.canonical: t.alias for t in ties}}

    def hit(n: str) -> bool:
        return any(fnmatch.fnmatchcase(x, g) for g in globs for x in (n, partner.get(n, n)))

    return [n for n in names if n not in aliases and hit(n)]


def pair_selected(tie: Tie, globs: list[str]) -> bool:
    """Whether a tied pair is pruned: either of its names matches a glob."""
    return any(fnmatch.fnmatchcase(n, g) for g in globs for n in (tie.canonical, tie.alias))


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


def block_of(name: str) -> int:
    """The block of a stage parameter (``layers.<block>.<...>``)."""
    return int(name.split(".")[1])


def below_equal(params: Params, tau: float) -> torch.Tensor:
    """Per block of ``params``: (block, elements below ``tau``, elements equal to it),
    one row each, in the order the blocks first appear."""
    rows: dict[int, list[int]] = {}
    for name, p in params.items():
        a = p.detach().abs().float()
        row = rows.setdefault(block_of(name), [block_of(name), 0, 0])
        row[1] += int((a < tau).sum())
        row[2] += int((a == tau).sum())
    return torch.tensor(list(rows.values()), dtype=torch.int64).reshape(-1, 3)


def equal_shares(k: int, rows: list[torch.Tensor]) -> dict[int, int]:
    """How many elements equal to tau each block prunes: the first ``k - below`` of
    them in model order (block by block, ascending), wherever each block lives.
    ``rows``: every stage's ``below_equal``."""
    table = sorted((int(b), int(below), int(eq)) for r in rows for b, below, eq in r.tolist())
    need = k - sum(below for _, below, _ in table)
    out: dict[int, int] = {}
    for b, _, eq in table:
        out[b] = max(0, min(eq, need))
        need -= out[b]
    return out


def keep_masks(
    params: Params, tau: float | None, shares: dict[int, int]
) -> dict[str, torch.Tensor]:
    """Masks pruning every |w| < tau and, in each block, the first ``shares[block]``
    elements with |w| == tau (params in model order within a block)."""
    masks: dict[str, torch.Tensor] = {}
    left = dict(shares)
    for name, p in params.items():
        if tau is None:
            masks[name] = torch.ones_like(p, dtype=torch.bool)
            continue
        a = p.detach().abs().float()
        pruned = a < tau
        b = block_of(name)
        if left.get(b, 0) > 0:
            equal = (a == tau).reshape(-1).nonzero().reshape(-1)[: left[b]]
            pruned.view(-1)[equal] = True
            left[b] -= equal.numel()
        masks[name] = ~pruned
    return masks


GatherFn = Callable[[torch.Tensor], list[torch.Tensor]]


def select_masks(params: Params, sparsity: float, gather: GatherFn):
    """Alg. 2 for one stage: ``gather(t)`` returns every stage's ``t`` (collective; any
    order). A stage may hold any blocks (a V rank holds two stages'): ties at the
    threshold are broken in the model's block order. Returns (masks, k, total, tau)."""
    counts = gather(torch.tensor([sum(p.numel() for p in params.values())], dtype=torch.int64))
    total = int(sum(int(c) for c in counts))
    if total == 0:
        raise ValueError(
            "pruning.prunable matches no parameter of the model; fix the globs "
            "(names look like 'layers.2.attn.qkv.weight') or set pruning.enabled: false"
        )
    k = count_to_prune(sparsity, total)
    if k == 0:
        return keep_masks(params, None, {}), 0, total, None
    flat = magnitudes(params)
    rest = total - k + 1  # the k-th smallest is the (total - k + 1)-th largest
    if k <= rest:
        tau = threshold(gather(smallest(flat, k)), k)
    else:  # offer the shorter list: each stage's `rest` largest
        offers = torch.cat([c.reshape(-1) for c in gather(largest(flat, rest))])
        tau = threshold([offers], offers.numel() - rest + 1)
    rows = [r.reshape(-1, 3) for r in gather(below_equal(params, tau).reshape(-1))]
    return keep_masks(params, tau, equal_shares(k, rows)), k, total, tau


def select_single(params: Params, sparsity: float):
    """The assembled-model reference: the whole model is one stage."""
    return select_masks(params, sparsity, lambda t: [t])
