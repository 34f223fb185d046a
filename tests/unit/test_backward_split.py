"""The runtime's zero-bubble backward: B (input gradient) then W (weight gradients)
gives the gradients of one whole backward, on every kind of stage, and B leaves
exactly the linear layers' weight gradients to W."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from jobctl.engine.model.blocks import Stage, gpt_def, lm_loss
from jobctl.engine.runtime.backward import (
    WeightStore,
    defer_linear_weights,
    input_grads,
    weight_grads,
)

LAYERS, HIDDEN, SEQ, VOCAB = 3, 32, 8, 64


def _stage(blocks: list[int], tied: bool = False) -> tuple[Stage, torch.Tensor]:
    torch.manual_seed(0)
    stage = Stage(gpt_def(LAYERS, HIDDEN, 4, SEQ, VOCAB, 0.0, tied, 0), blocks)
    x = torch.randint(0, VOCAB, (2, SEQ)) if blocks[0] == 0 else torch.randn(2, SEQ, HIDDEN)
    return stage, x


def _root(stage: Stage, x: torch.Tensor, last: bool, seed: int = 2):
    out = stage(x)
    if last:
        y = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
        return lm_loss(out, y), None
    return out, torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))


def _whole(stage: Stage, x: torch.Tensor, last: bool):
    stage.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(x.is_floating_point())
    root, grad = _root(stage, x, last)
    root.backward(grad)
    return x.grad, {n: p.grad.clone() for n, p in stage.named_parameters()}


def _split(stage: Stage, x: torch.Tensor, last: bool):
    store = WeightStore()
    deferred = defer_linear_weights(stage, store)
    stage.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(x.is_floating_point())
    store.recording = 0  # as the executor does around a split micro-batch's forward
    root, grad = _root(stage, x, last)
    store.recording = None
    others = [p for p in stage.parameters() if p not in deferred]
    input_grads(root, grad, x, others, store, 0)
    # Between B and W exactly the linear layers' weights wait for their gradients.
    assert deferred and all(p.grad is None for p in deferred)
    assert all(p.grad is not None for p in others)
    assert len(store.pending[0]) == sum(isinstance(m, nn.Linear) for m in stage.modules())
    weight_grads(store, 0)
    assert not store.pending
    return x.grad, {n: p.grad.clone() for n, p in stage.named_parameters()}


@pytest.mark.parametrize(
    ("blocks", "last", "tied"),
    [
        ([1, 2], False, False),
        ([3, 4], True, False),
        ([0, 1], False, False),
        ([0, 1, 2, 3, 4], True, True),
    ],
    ids=["middle", "last", "first", "whole-tied"],
)
def test_split_backward_equals_whole_backward(blocks: list[int], last: bool, tied: bool) -> None:
    torch.set_num_threads(1)
    stage, x = _stage(blocks, tied)
    dx_whole, whole = _whole(stage, x, last)
    dx_split, split = _split(stage, x, last)
    if x.is_floating_point():
        torch.testing.assert_close(dx_split, dx_whole, rtol=0, atol=1e-6)
    assert set(split) == set(whole) and whole
    for name, g in whole.items():
        torch.testing.assert_close(split[name], g, rtol=1e-5, atol=1e-6, msg=name)
    # Patched layers outside a B (the calibration probe, a whole backward) stay whole.
    dx_again, again = _whole(stage, x, last)
    for name, g in whole.items():
        torch.testing.assert_close(again[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_w_accumulates_across_micro_batches() -> None:
    """Two B's, then their two W's: the gradient of two whole backwards."""
    stage, x = _stage([1, 2])
    once = _whole(stage, x, last=False)[1]
    store = WeightStore()
    deferred = defer_linear_weights(stage, store)
    others = [p for p in stage.parameters() if p not in deferred]
    stage.zero_grad(set_to_none=True)
    for i in range(2):
        xi = x.clone().requires_grad_(True)
        store.recording = i
        out, grad = _root(stage, xi, last=False)
        store.recording = None
        input_grads(out, grad, xi, others, store, i)
    weight_grads(store, 1)
    weight_grads(store, 0)
    for name, p in stage.named_parameters():
        torch.testing.assert_close(p.grad, 2 * once[name], rtol=1e-5, atol=1e-5, msg=name)


def test_layers_replaced_by_someone_else_keep_their_forward() -> None:
    stage, _ = _stage([1])
    layer = next(m for m in stage.modules() if isinstance(m, nn.Linear))
    layer.forward = lambda x: nn.functional.linear(x, layer.weight, layer.bias)  # e.g. CSR
    deferred = defer_linear_weights(stage, WeightStore())
    assert layer.weight not in deferred and len(deferred) > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_split_backward_under_autocast_keeps_fp32_weight_gradients(dtype) -> None:
    # The step runs B and W under its autocast (runtime.step.autocast): W's products
    # come out in half and go back to the fp32 weights as autograd's cast does.
    torch.set_num_threads(1)
    stage, x = _stage([3, 4])
    with torch.autocast("cpu", dtype=dtype):
        whole = _whole(stage, x, last=True)[1]
        split = _split(stage, x, last=True)[1]
    for name, g in whole.items():
        assert split[name].dtype == torch.float32, name
        # the same half products and casts as autograd's: seen bit-equal
        torch.testing.assert_close(split[name], g, rtol=0, atol=0, msg=name)


def test_w_reaches_a_layer_whose_input_needs_no_gradient() -> None:
    """A frozen embedding feeds a linear layer: B asks autograd for no input before
    it, so only the recorded output edge makes autograd hand back that layer's output
    gradient (without it, B pruned the layer and its weights got no gradient)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN)
    )
    model[0].weight.requires_grad_(False)
    tokens = torch.randint(0, VOCAB, (2, SEQ))
    model(tokens).square().sum().backward()
    whole = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    store = WeightStore()
    deferred = defer_linear_weights(model, store)
    store.recording = 0
    root = model(tokens).square().sum()
    store.recording = None
    input_grads(root, None, tokens, [p for p in model.parameters() if p not in deferred], store, 0)
    assert model[1].weight.grad is None and len(store.pending[0]) == 1
    weight_grads(store, 0)
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, whole[n], rtol=1e-5, atol=1e-6, msg=n)
