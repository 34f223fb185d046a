"""A stage's backward, whole or split into input gradient (B) and weight gradients (W).

Zero-bubble schedules (arXiv 2401.10241) run B as soon as the next stage's gradient
arrives, since the previous stage waits for it, and W later, where the stage would
otherwise idle. ``input_grads`` computes only the gradient of the stage input with
``torch.autograd.grad`` on the stage inputs, and keeps, for W, just the gradients
that reach the autograd nodes where the weights' branches join the input's path;
``weight_grads`` then runs autograd from those nodes to the weights only, so B and W
together do the work of one whole backward. B is
``torch.distributed.pipelining._backward.stage_backward_input``, the function
PyTorch's own zero-bubble schedules run. W differs from its
``stage_backward_weight``, which runs autograd once per group of weights (one per
layer, each call paying the engine's start-up): ``weight_grads`` runs it once for all
of them, each branch point clamped to its saved gradient so that a point below
another is not counted twice (the same clamp PyTorch applies within a group).

A stage whose input needs no gradient (the first one: it reads tokens) has nothing
for B to compute: its B runs the whole backward and its W has nothing left to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge
from torch.distributed.pipelining._backward import stage_backward_input


@dataclass
class PendingWeights:
    """What W needs after B: the captured gradients at the weights' branch points."""

    params: list[torch.nn.Parameter]
    groups: list[dict] = field(default_factory=list)


def input_grads(
    out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor, params: list
) -> PendingWeights | None:
    """B: ``x.grad`` from ``out`` (the loss when ``grad`` is None); the weight
    gradients are left for ``weight_grads``. None: nothing is left (whole backward)."""
    if not x.requires_grad:
        if grad is None:
            out.backward()
        else:
            torch.autograd.backward(out, grad)
        return None
    grads = None if grad is None else [grad]
    _, groups = stage_backward_input([out], grads, [x], iter(params))
    return PendingWeights(params, groups)


def weight_grads(pending: PendingWeights | None) -> None:
    """W: accumulate the weight gradients B left; frees the rest of the graph."""
    if pending is None:
        return
    saved: dict = {}  # branch point -> the gradients B saw arrive there
    for group in pending.groups:
        saved.update(zip(group["intermediates"], group.get("grads") or (), strict=False))
    roots = [(GradientEdge(node, k), g) for node, gs in saved.items() for k, g in enumerate(gs)]
    roots = [(edge, g) for edge, g in roots if g is not None]
    if not roots:
        return
    params = [p for p in pending.params if p.requires_grad]
    hooks = [node.register_prehook(lambda _, gs=gs: gs) for node, gs in saved.items()]
    try:
        grads = torch.autograd.grad(
            [edge for edge, _ in roots],
            [_grad_edge(p) for p in params],
            grad_outputs=[g for _, g in roots],
            allow_unused=True,
        )
    finally:
        for hook in hooks:
            hook.remove()
    for p, g in zip(params, grads, strict=True):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g


def _grad_edge(p: torch.nn.Parameter) -> GradientEdge:
    """The edge into a weight's AccumulateGrad node (what autograd.grad can target)."""
    return GradientEdge(p.view_as(p).grad_fn.next_functions[0][0], 0)
