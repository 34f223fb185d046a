"""A stage's backward split into input gradient (B) and weight gradients (W).

Zero-bubble schedules (arXiv 2401.10241) run B as soon as the next stage's gradient
arrives, since the previous stage waits for it, and W later, where the stage would
otherwise idle. The weight gradients worth moving are the matrix products of the
linear layers: ``defer_linear_weights`` routes a stage's ``nn.Linear`` layers through
``DeferredLinear``, whose backward, while a B is running, returns the input gradient
only and keeps the layer's input and output gradient for W. B itself
(``input_grads``) is ``torch.autograd.grad`` on the stage input and on the weights
that are not deferred (norms, embeddings), which are cheap and finished in B; it frees
the autograd graph, so between B and W a micro-batch holds only what W multiplies.
W (``weight_grads``) then adds ``g^T x`` (and ``sum g`` for a bias) to each layer's
gradient: B and W together do the arithmetic of one whole backward, in the same
order per layer, and nothing else.

A layer whose ``forward`` something else replaced (pruning's CSR kernels) keeps it and
gets its weight gradient in B; so does any other kind of layer. Outside a B (a whole
backward, the calibration probe) ``DeferredLinear`` computes every gradient at once.
"""

from __future__ import annotations

import types
from collections import defaultdict

import torch
import torch.nn.functional as F  # noqa: N812 - torch's convention
from torch import nn

Stash = list[tuple[nn.Linear, torch.Tensor, torch.Tensor]]  # (layer, input, output grad)


class WeightStore:
    """The weight-gradient work B left, by micro-batch, for W."""

    def __init__(self) -> None:
        self.active: int | None = None  # the micro-batch whose B is running
        self.pending: dict[int, Stash] = defaultdict(list)


class DeferredLinear(torch.autograd.Function):
    """``F.linear`` whose weight gradient waits for W while a B is running."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: nn.Linear, store: WeightStore):  # noqa: ANN001
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.store, ctx.has_bias = layer, store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001
        x, weight = ctx.saved_tensors
        dx = g.matmul(weight) if ctx.needs_input_grad[0] else None
        if ctx.store.active is not None:
            ctx.store.pending[ctx.store.active].append((ctx.layer, x, g))
            return dx, None, None, None, None
        dw, db = _linear_weight_grads(x, g, ctx.has_bias)
        return dx, dw, db, None, None


def _linear_weight_grads(x: torch.Tensor, g: torch.Tensor, bias: bool):
    """``g^T x`` over all leading dimensions, and the bias gradient ``sum g``."""
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
    return g2.t().mm(x2), (g2.sum(0) if bias else None)


def _deferred_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():  # no graph (a forward recomputed later): nothing to defer
        return F.linear(x, self.weight, self.bias)
    return DeferredLinear.apply(x, self.weight, self.bias, self, self._jobctl_store)


def defer_linear_weights(stage: nn.Module, store: WeightStore) -> set[nn.Parameter]:
    """Route ``stage``'s plain ``nn.Linear`` layers through ``DeferredLinear`` (once);
    returns the parameters whose gradients W computes."""
    deferred: set[nn.Parameter] = set()
    for mod in stage.modules():
        if type(mod) is not nn.Linear:
            continue
        if "forward" not in mod.__dict__:
            mod.forward = types.MethodType(_deferred_forward, mod)
        elif getattr(mod.forward, "__func__", None) is not _deferred_forward:
            continue  # replaced by someone else: its gradient stays in B
        mod._jobctl_store = store
        deferred.update(p for p in (mod.weight, mod.bias) if p is not None)
    return deferred


def input_grads(
    root: torch.Tensor,
    grad: torch.Tensor | None,
    x: torch.Tensor,
    params: list[nn.Parameter],
    store: WeightStore,
    i: int,
) -> None:
    """B of micro-batch ``i``: ``x.grad`` and the gradients of ``params`` (those not
    deferred) from ``root`` (the output with ``grad``, or the loss); linear layers
    leave their weight gradients in ``store`` for ``weight_grads``."""
    leaves = ([x] if x.requires_grad else []) + [p for p in params if p.requires_grad]
    store.active = i
    try:
        grads = torch.autograd.grad(root, leaves, grad, allow_unused=True) if leaves else ()
    finally:
        store.active = None
    for leaf, g in zip(leaves, grads, strict=True):
        _accumulate(leaf, g)


def weight_grads(store: WeightStore, i: int) -> None:
    """W of micro-batch ``i``: the linear layers' weight (and bias) gradients B left."""
    for layer, x, g in store.pending.pop(i, ()):
        dw, db = _linear_weight_grads(x, g, layer.bias is not None)
        _accumulate(layer.weight, dw)
        if db is not None:
            _accumulate(layer.bias, db)


def _accumulate(t: torch.Tensor, g: torch.Tensor | None) -> None:
    if g is None or not t.requires_grad:
        return
    # W's products run under the step's autocast (fp16/bf16): cast back, as autograd's
    # cast of an fp32 weight does, so the weight keeps an fp32 gradient
    g = g.to(t.dtype)
    if t.grad is None:  # a weight's gradient is its own tensor, as autograd leaves it
        t.grad = g.detach().clone() if isinstance(t, nn.Parameter) else g.detach()
    else:
        t.grad += g
