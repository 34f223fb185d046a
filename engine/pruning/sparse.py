"""Sparse compute for pruned linear layers: CSR kernels with a masked weight gradient.

PyTorch has no backward for a CSR weight (DynPipe sec. 3.0.5 hits the same wall on GPU),
so :class:`CsrLinearFn` supplies one: forward ``y = x W^T + b`` as ``W_csr @ x^T``,
input gradient as ``W^T_csr @ g^T`` and the weight gradient as a sampled dense-dense
product at W's nonzeros only (``torch.sparse.sampled_addmm``), scattered back into a
dense gradient, so the dense parameter, its optimizer and checkpoints stay as they
are.

The sparsity pattern is the mask's, fixed between pruning steps, so the CSR structure
(row offsets, column indices of ``W`` and of ``W^T``) is built once per mask and every
optimizer step only gathers the kept values (``refresh``): a rebuild from the dense
weight (``to_sparse_csr``) would scan every element and cost more than the kernels
save.

:func:`use_csr` swaps chosen ``nn.Linear`` forwards in place (parameter names do not
change) and :func:`use_dense` restores them. Which layers pay off on a device is
decided from the measured crossover (``pruning_crossover``).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable

import torch
from torch import nn


def _structure(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row offsets, column indices, flat indices into ``mask``) of its True entries,
    row-major: the CSR layout of a matrix with exactly this pattern."""
    rows, cols = mask.nonzero(as_tuple=True)
    counts = torch.bincount(rows, minlength=mask.shape[0])
    crow = torch.zeros(mask.shape[0] + 1, dtype=torch.int64, device=mask.device)
    crow[1:] = counts.cumsum(0)
    return crow, cols, rows * mask.shape[1] + cols


class CsrWeights:
    """CSR copies (``w``, ``wt`` = W^T) of one linear layer's masked weight."""

    def __init__(self, weight: torch.Tensor, mask: torch.Tensor):
        self.mask = mask.to(device=weight.device, dtype=torch.bool)
        self.shape = tuple(weight.shape)
        self.crow, self.col, self.idx = _structure(self.mask)
        t_crow, t_col, t_flat = _structure(self.mask.t())
        # element (j, i) of W^T is W[i, j], flat index i * in + j in W
        self.t_crow, self.t_col = t_crow, t_col
        self.t_idx = (t_flat % self.shape[0]) * self.shape[1] + t_flat // self.shape[0]
        self.refresh(weight)

    @property
    def nnz(self) -> int:
        return int(self.idx.numel())

    @torch.no_grad()
    def refresh(self, weight: torch.Tensor) -> None:
        """Gather the kept values of the (updated) weight into both CSR copies."""
        flat = weight.detach().reshape(-1)
        out_f, in_f = self.shape
        with warnings.catch_warnings():  # "CSR support is in beta", once per process
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            self.w = torch.sparse_csr_tensor(
                self.crow,
                self.col,
                flat.index_select(0, self.idx),
                (out_f, in_f),
                check_invariants=False,  # the structure is built from the mask once
            )
            self.wt = torch.sparse_csr_tensor(
                self.t_crow,
                self.t_col,
                flat.index_select(0, self.t_idx),
                (in_f, out_f),
                check_invariants=False,
            )

    def dense_grad(self, values: torch.Tensor) -> torch.Tensor:
        """A dense gradient holding ``values`` at the kept positions, zero elsewhere."""
        g = values.new_zeros(self.shape[0] * self.shape[1])
        g.index_copy_(0, self.idx, values)
        return g.view(self.shape)


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
        csr: CsrWeights = ctx.csr
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = torch.sparse.mm(csr.wt, g2.t()).t().reshape(ctx.shape)
        sampled = torch.sparse.sampled_addmm(csr.w, g2.t(), x2, beta=0.0)
        gw = csr.dense_grad(sampled.values())
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb, None


def csr_linear(x: torch.Tensor, weight: torch.Tensor, bias, csr: CsrWeights) -> torch.Tensor:
    return CsrLinearFn.apply(x, weight, bias, csr)


def _csr_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return csr_linear(x, self.weight, self.bias, self._csr)


Choose = Callable[[nn.Linear, torch.Tensor], bool]  # (layer, its mask) -> compute in CSR?


def use_csr(
    block: nn.Module, prefix: str, masks: dict[str, torch.Tensor], choose: Choose
) -> list[nn.Linear]:
    """Run each masked ``nn.Linear`` of ``block`` (named ``prefix`` + ...) that
    ``choose`` picks through CSR; returns the swapped layers."""
    swapped = []
    for name, mod in block.named_modules():
        key = f"{prefix}{name}.weight" if name else f"{prefix}weight"
        if isinstance(mod, nn.Linear) and key in masks and choose(mod, masks[key]):
            mod._csr = CsrWeights(mod.weight, masks[key])
            mod.forward = types.MethodType(_csr_forward, mod)
            swapped.append(mod)
    return swapped


def use_dense(layers: list[nn.Linear]) -> None:
    """Undo :func:`use_csr`."""
    for mod in layers:
        del mod.forward, mod._csr


def refresh(layers: list[nn.Linear]) -> None:
    """Re-gather the CSR values from the updated weights (after an optimizer step)."""
    for mod in layers:
        mod._csr.refresh(mod.weight)
