"""A recomputed forward replays the random state of every generator its stage draws
from (``engine/runtime/rng.py``): on a GPU, dropout's masks come from the device's
generator, which a CPU-only capture (the executor's and Mobius's before) did not hold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jobctl.engine.model.blocks import Stage, gpt_def
from jobctl.engine.runtime import rng

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _stream(device: torch.device, n: int) -> list[torch.Tensor]:
    return [torch.rand(4, device=device) for _ in range(n)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_replay_draws_what_the_capture_saw_and_the_stream_goes_on(device):
    device = torch.device(device)
    torch.manual_seed(3)
    expected = _stream(device, 3)
    torch.manual_seed(3)
    state = rng.capture(device)
    first, second = _stream(device, 2)
    with rng.replayed(state):
        again = _stream(device, 2)
    after = torch.rand(4, device=device)
    assert torch.equal(again[0], first) and torch.equal(again[1], second)
    assert torch.equal(after, expected[2])  # the replay drew nothing from the run's stream


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_isolated_draws_leave_both_generators_as_they_were(device):
    device = torch.device(device)
    torch.manual_seed(5)
    expected = _stream(device, 1)[0], torch.rand(4)
    torch.manual_seed(5)
    with rng.isolated(device):
        _stream(device, 3), torch.rand(8)
    assert torch.equal(torch.rand(4, device=device), expected[0])
    assert torch.equal(torch.rand(4), expected[1])


def test_a_cpu_capture_holds_no_device_state():
    state = rng.capture(torch.device("cpu"))
    assert state.device is None and state.device_state is None
    assert torch.equal(state.cpu, torch.get_rng_state())


@CUDA
def test_dropout_on_the_gpu_is_replayed_where_a_cpu_only_capture_was_not():
    device = torch.device("cuda")
    ones = torch.ones(4096, device=device)
    torch.manual_seed(11)
    cpu_only, state = torch.get_rng_state(), rng.capture(device)
    mask = F.dropout(ones, 0.5)
    F.dropout(ones, 0.5)  # the run moves on before the backward recomputes
    with torch.random.fork_rng(devices=[]):  # the capture the executor used to make
        torch.set_rng_state(cpu_only)
        stale = F.dropout(ones, 0.5)
    with rng.replayed(state):
        replayed = F.dropout(ones, 0.5)
    assert not torch.equal(stale, mask)  # what the old capture trained on
    assert torch.equal(replayed, mask)


@CUDA
def test_a_recomputed_gpu_stage_equals_its_first_forward():
    device = torch.device("cuda")
    mdef = gpt_def(layers=2, hidden=32, heads=4, seq_len=16, vocab=64, dropout=0.2, seed=1)
    stage = Stage(mdef, range(1, 3)).to(device)
    x = torch.randn(2, 16, 32, device=device)
    state = rng.capture(device)
    with torch.no_grad():  # the forward without a graph, as a recomputed micro-batch runs
        first = stage(x)
    torch.rand(16, device=device)
    with rng.replayed(state):  # the backward's recompute
        again = stage(x.requires_grad_(True))
    assert torch.equal(again.detach(), first)
