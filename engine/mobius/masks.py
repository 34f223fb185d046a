"""Pruning masks on a Mobius rank's swapped records.

A Mobius stage's weights, gradients and optimizer slots live in its flat record in the
tier (``layout``), not in a module, so masks are applied where the record is: once
when they are adopted (:func:`hold`: the pruned weights and optimizer slots of every
record of the rank zeroed), then in every update on upload (``MobiusRunner._update``
calls :func:`zero` on the gradient section before the optimizer step and on the
weight section after it, so weight decay and momentum never revive a pruned weight).
``pruned`` maps a parameter's name (the unsplit model's; a tied alias by its own) to
its flat ``True``-where-pruned vector; masks stay in host memory, a bit per weight's
byte, beside the tier.
"""

from __future__ import annotations

import torch

from jobctl.engine.mobius.layout import StageLayout


def zero(pruned: dict[str, torch.Tensor], lay: StageLayout, flat: torch.Tensor, k: int) -> None:
    """Zero the pruned elements of section ``k`` (0 weights, 1 gradients, 2+ slots) of
    a record laid out by ``lay`` in ``flat``."""
    for span in lay.spans:
        mask = pruned.get(span.name)
        if mask is not None:
            at = k * lay.n + span.offset
            flat[at : at + span.numel].masked_fill_(mask.to(flat.device), 0.0)


def hold(runner, masks: dict[str, torch.Tensor]) -> None:  # noqa: ANN001 - MobiusRunner
    """Adopt ``masks`` (``True``: kept, by parameter name) for ``runner``'s stages: the
    pending update applied first, then each record's pruned weights and slots zeroed."""
    runner.flush()
    names = {s.name for lay in runner.layouts.values() for s in lay.spans}
    runner.pruned.update({n: ~m.reshape(-1).bool() for n, m in masks.items() if n in names})
    for j in runner.mine:
        lay, flat = runner.layouts[j], runner._buffer(j)
        kept = [0, *range(2, lay.sections)]  # weights and slots; gradients are per step
        ranges = [lay.section(k) for k in kept]
        kinds = ["params", *["optim"] * len(lay.slots)]
        runner.tier.load(j, flat, ranges, kinds).result()
        for k in kept:
            zero(runner.pruned, lay, flat, k)
        runner.tier.store(j, flat, ranges, kinds).result()
        runner.tier.drain()


def held(runner) -> dict[str, torch.Tensor]:  # noqa: ANN001 - MobiusRunner
    """The masks ``runner`` holds, shaped like their parameters (``True``: kept)."""
    shapes = {s.name: s.shape for lay in runner.layouts.values() for s in lay.spans}
    return {n: (~p).view(shapes[n]) for n, p in runner.pruned.items()}
