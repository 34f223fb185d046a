"""A Mobius stage made resident: its parameters, gradients and optimizer state as views
of one reserved device buffer.

The device holds two reserved buffers, each the size of the largest stage record:
this rank's k-th stage always runs from buffer ``k % 2``, so the next stage in the
step's order is uploaded into the other one while this one computes (Mobius sec.
3.1's reserved memory for prefetching). Binding points each parameter's ``.data``
(and ``.grad``, and the optimizer's per-parameter slots) at its span of the buffer,
so backward accumulates gradients and the optimizer updates in place, straight in
the record that goes back down; releasing points them at an empty placeholder, so nothing of
the stage stays resident. The stage's module objects and small optimizer counters
(Adam's ``step``) stay in memory: they are bytes, not the model.
"""

from __future__ import annotations

import torch
from torch import nn

from jobctl.engine.mobius.layout import StageLayout


class Reserved:
    """The two reserved device buffers (flat fp32, the largest record each)."""

    def __init__(self, elements: int, device: torch.device):
        self.buffers = [torch.zeros(elements, device=device) for _ in range(2)]
        self.placeholder = torch.empty(0, device=device)

    def of(self, k: int) -> torch.Tensor:
        """The buffer of this rank's ``k``-th stage (consecutive stages alternate)."""
        return self.buffers[k % 2]


def _view(flat: torch.Tensor, section: int, lay: StageLayout, span) -> torch.Tensor:
    start = section * lay.n + span.offset
    return flat[start : start + span.numel].view(span.shape)


def bind(
    mod: nn.Module,
    lay: StageLayout,
    opt: torch.optim.Optimizer,
    flat: torch.Tensor,
    grads: bool,
    slots: bool,
) -> None:
    """Point ``mod``'s parameters (and gradients, optimizer slots) into ``flat``."""
    params = dict(mod.named_parameters())
    for span in lay.spans:
        p = params[span.name]
        p.data = _view(flat, 0, lay, span)
        p.grad = _view(flat, 1, lay, span) if grads else None
        if slots:
            for k, slot in enumerate(lay.slots):
                opt.state[p][slot] = _view(flat, 2 + k, lay, span)


def release(mod: nn.Module, lay: StageLayout, opt, placeholder: torch.Tensor) -> None:
    """Leave nothing of the stage's record referenced (the buffer is reused)."""
    for p in mod.parameters():
        p.data = placeholder
        p.grad = None
        for slot in lay.slots:
            opt.state[p].pop(slot, None)


def pack(mod: nn.Module, lay: StageLayout) -> torch.Tensor:
    """The parameter section of a freshly built stage (its initial weights)."""
    params = dict(mod.named_parameters())
    return torch.cat([params[s.name].detach().reshape(-1) for s in lay.spans])


def start_counters(mod: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Give Adam's per-parameter step counter its fresh value, so the state is not
    empty when the slots are bound (torch only initialises an empty state)."""
    if isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
        for p in mod.parameters():
            opt.state[p]["step"] = torch.tensor(0.0)
