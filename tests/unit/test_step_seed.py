"""A step's RNG seed: on a CPU, the CPU generator alone, drawing exactly the stream
``torch.manual_seed`` gives (parity with the one-process reference rests on it)."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.runtime.step import seed_rng, step_seed


def _draws() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.ones(64)
    return torch.randn(8), torch.nn.functional.dropout(x, p=0.5, training=True)


@pytest.mark.parametrize("step", [0, 1, 37])
def test_cpu_seed_draws_torch_manual_seeds_stream(step):
    seed = step_seed(1234, step, rank=1)
    torch.manual_seed(seed)
    want = _draws()
    torch.manual_seed(999)  # something else in between
    torch.randn(3)
    seed_rng(seed, torch.device("cpu"))
    got = _draws()
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_steps_and_ranks_draw_different_streams():
    streams = []
    for step, rank in [(0, 0), (1, 0), (0, 1)]:
        seed_rng(step_seed(1234, step, rank), torch.device("cpu"))
        streams.append(torch.randn(4))
    assert not torch.equal(streams[0], streams[1])
    assert not torch.equal(streams[0], streams[2])
