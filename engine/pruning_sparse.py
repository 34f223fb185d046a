"""Sparse compute for pruned linear layers: CSR kernels with a masked weight gradient.

PyTorch has no backward for a CSR weight (DynPipe sec. 3.0.5 hits the same wall on GPU),
so :class:`CsrLinearFn` supplies one: forward ``y = x W^T + b`` as ``W_csr @ x^T``,
input gradient as ``W^T_csr @ g^T`` and the weight gradient as a sampled dense-dense
product at W's nonzeros only (``torch.sparse.sampled_addmm``), scattered back into a
dense gradient, so the dense parameter, its optimizer and checkpoints stay as they
are. The CSR copies (``W`` and ``W^T``) are rebuilt after every optimizer step.

:func:`use_csr` swaps a block's ``nn.Linear`` forwards in place (parameter names do
not change) and :func:`use_dense` restores them. Whether CSR pays off on a device is
measured by ``benchmarks/sparse_crossover.py``.
"""

from __future__ import annotations

import types
import warnings

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class CsrWeights:
    """CSR copies of one linear layer's masked weight, refreshed after each update."""

    def __init__(self, weight: torch.Tensor, mask: torch.Tensor):
        self.mask = mask
        self.refresh(weight)

    @torch.no_grad()
    def refresh(self, weight: torch.Tensor) -> None:
        w = weight.detach() * self.mask
        with warnings.catch_warnings():  # "CSR support is in beta", once per process
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            self.w = w.to_sparse_csr()
            self.wt = w.t().contiguous().to_sparse_csr()
        self.pattern = self.w  # the sampled product needs only the sparsity pattern


class CsrLinearFn(torch.autograd.Function):
    """``F.linear`` through CSR kernels; gradients equal the dense masked ones."""

    @staticmethod
    def forward(ctx, x, weight, bias, csr: CsrWeights):
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.sparse.mm(csr.w, x2.t()).t()
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x2)
        ctx.csr, ctx.has_bias, ctx.shape = csr, bias is not None, x.shape
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        (x2,) = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = torch.sparse.mm(ctx.csr.wt, g2.t()).t().reshape(ctx.shape)
        gw_sparse = torch.sparse.sampled_addmm(ctx.csr.pattern, g2.t(), x2, beta=0.0)
        gw = gw_sparse.to_dense()
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb, None


def csr_linear(x: torch.Tensor, weight: torch.Tensor, bias, csr: CsrWeights) -> torch.Tensor:
    return CsrLinearFn.apply(x, weight, bias, csr)


def _csr_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return csr_linear(x, self.weight, self.bias, self._csr)


def use_csr(block: nn.Module, prefix: str, masks: dict[str, torch.Tensor]) -> list[nn.Linear]:
    """Run every masked ``nn.Linear`` of ``block`` (named ``prefix`` + ...) through CSR."""
    swapped = []
    for name, mod in block.named_modules():
        key = f"{prefix}{name}.weight" if name else f"{prefix}weight"
        if isinstance(mod, nn.Linear) and key in masks:
            mod._csr = CsrWeights(mod.weight, masks[key])
            mod.forward = types.MethodType(_csr_forward, mod)
            swapped.append(mod)
    return swapped


def use_dense(layers: list[nn.Linear]) -> None:
    """Undo :func:`use_csr`."""
    for mod in layers:
        del mod.forward, mod._csr


def refresh(layers: list[nn.Linear]) -> None:
    """Rebuild the CSR copies from the updated weights (after an optimizer step)."""
    for mod in layers:
        mod._csr.refresh(mod.weight)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    return F.linear(x, weight, bias)
