"""A stage's backward split into input gradient (B) and weight gradients (W).

Zero-bubble schedules (arXiv 2401.10241) run B as soon as the next stage's gradient
arrives, since the previous stage waits for it, and W later, where the stage would
otherwise idle. The weight gradients worth moving are the matrix products of the
linear layers: ``defer_linear_weights`` routes a stage's ``nn.Linear`` layers through
``_deferred_forward``, which, while the forward of a split micro-batch runs
(``WeightStore.recording``), keeps the layer, its input and the gradient edge of its
output (``torch.autograd.graph.get_gradient_edge``: the node, not the tensor, so no
activation is held longer). B (``input_grads``) is one ``torch.autograd.grad`` on the
stage input, the weights that are not deferred (norms, embeddings: cheap, finished in
B) and those edges: autograd computes every input gradient in C++, skips the deferred
weights' products, hands back each linear layer's output gradient, and frees the
graph, so between B and W a micro-batch holds only what W multiplies. W
(``weight_grads``) then adds ``g^T x`` (and ``sum g`` for a bias) to each layer's
gradient: B and W together do the arithmetic of one whole backward and nothing else.
Asking for the edges also reaches a layer whose input needs no gradient (a frozen
embedding before it), which autograd would otherwise prune from B.

A layer whose ``forward`` something else replaced (pruning's CSR kernels) keeps it and
gets its weight gradient in B; so does any other kind of layer. A forward outside a
recording (a whole backward, the calibration probe, evaluation) is plain ``F.linear``.
"""

from __future__ import annotations

import types
from collections import defaultdict

import torch
import torch.nn.functional as F  # noqa: N812 - torch's convention
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

Stash = list[tuple[nn.Linear, torch.Tensor, torch.Tensor]]  # (layer, input, output grad)
Edges = list[tuple[nn.Linear, torch.Tensor, GradientEdge]]  # (layer, input, output edge)


class WeightStore:
    """The weight-gradient work of split micro-batches: what their forwards recorded
    for B, and what B left, by micro-batch, for W."""

    def __init__(self) -> None:
        self.recording: int | None = None  # the split micro-batch whose forward runs
        self.edges: dict[int, Edges] = defaultdict(list)
        self.pending: dict[int, Stash] = {}


def _deferred_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = F.linear(x, self.weight, self.bias)
    store = self._jobctl_store
    if store.recording is not None and y.requires_grad:
        store.edges[store.recording].append((self, x, get_gradient_edge(y)))
    return y


def defer_linear_weights(stage: nn.Module, store: WeightStore) -> set[nn.Parameter]:
    """Route ``stage``'s plain ``nn.Linear`` layers through ``_deferred_forward``
    (once); returns the parameters whose gradients W computes."""
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
    """B of micro-batch ``i`` (its forward ran under ``store.recording = i``):
    ``x.grad`` and the gradients of ``params`` (those not deferred) from ``root``
    (the output with ``grad``, or the loss); the linear layers' output gradients
    wait in ``store`` for ``weight_grads``."""
    edges = store.edges.pop(i, [])
    leaves = ([x] if x.requires_grad else []) + [p for p in params if p.requires_grad]
    inputs = leaves + [e for _, _, e in edges]
    grads = torch.autograd.grad(root, inputs, grad, allow_unused=True) if inputs else ()
    for leaf, g in zip(leaves, grads[: len(leaves)], strict=True):
        _accumulate(leaf, g, fresh=False)
    outs = grads[len(leaves) :]
    store.pending[i] = [
        (m, xi, g) for (m, xi, _), g in zip(edges, outs, strict=True) if g is not None
    ]


def weight_grads(store: WeightStore, i: int) -> None:
    """W of micro-batch ``i``: the linear layers' weight (and bias) gradients B left."""
    for layer, x, g in store.pending.pop(i, ()):
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        _add_product(layer.weight, g2, x2)
        if layer.bias is not None:
            _accumulate(layer.bias, g2.sum(0), fresh=True)


def _add_product(w: nn.Parameter, g2: torch.Tensor, x2: torch.Tensor) -> None:
    """``w.grad += g2^T x2``: one fused ``addmm_`` where every dtype agrees (fp32, no
    autocast); else as autograd does it, the product in the autocast's dtype cast
    back to the weight's."""
    if not w.requires_grad:
        return
    same = g2.dtype == x2.dtype == w.dtype and not torch.is_autocast_enabled(g2.device.type)
    if same and w.grad is not None:
        w.grad.addmm_(g2.t(), x2)
    else:
        _accumulate(w, g2.t().mm(x2), fresh=True)


def _accumulate(t: torch.Tensor, g: torch.Tensor | None, fresh: bool) -> None:
    """Add ``g`` to ``t.grad``. ``fresh``: a tensor W just computed, which no one else
    holds; else B's, where autograd may hand back a tensor it shares (the received
    gradient itself), so a weight's first one is copied."""
    if g is None or not t.requires_grad:
        return
    g = g.to(t.dtype)  # products under the step's autocast come out in half
    if t.grad is not None:
        t.grad += g
    elif fresh:
        t.grad = g
    else:  # a weight's gradient is its own tensor, as autograd leaves it
        t.grad = g.detach().clone() if isinstance(t, nn.Parameter) else g.detach()
