"""Stage-aware recomputation at run time (Merak sec. 5.2): a stage keeps the
activations of its first ``keep`` blocks and recomputes the rest in backward, with the
same numbers as keeping everything (dropout included) and fewer saved bytes."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.model.blocks import Stage, gpt_def


def _saved_bytes_and_grads(keep: int | None):
    mdef = gpt_def(layers=4, hidden=32, heads=4, seq_len=16, vocab=64, dropout=0.2, seed=1)
    stage = Stage(mdef, range(1, 5), keep)  # four transformer blocks
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    saved = []

    def pack(t: torch.Tensor):
        saved.append(t.numel() * t.element_size())
        return t

    torch.manual_seed(7)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(x)
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
    return sum(saved), out.detach(), x.grad.clone(), grads


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_partial_recompute_equals_keeping_everything(keep):
    full_bytes, out, gx, grads = _saved_bytes_and_grads(None)
    part_bytes, out_k, gx_k, grads_k = _saved_bytes_and_grads(keep)
    assert torch.equal(out, out_k)  # dropout masks replayed bit for bit
    torch.testing.assert_close(gx_k, gx, atol=0, rtol=0)
    for n, g in grads.items():
        torch.testing.assert_close(grads_k[n], g, atol=1e-7, rtol=0, msg=n)
    assert part_bytes < full_bytes * (keep + 1) / 4 + 1


def test_keep_all_blocks_is_no_checkpoint():
    mdef = gpt_def(layers=2, hidden=16, heads=2, seq_len=8, vocab=32)
    stage = Stage(mdef, range(4), keep=4)
    assert stage.split_kept() == ([0, 1, 2, 3], [])
    assert Stage(mdef, range(4), keep=1).split_kept() == ([0], [1, 2, 3])
