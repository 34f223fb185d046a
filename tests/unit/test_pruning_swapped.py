"""Pruning over Mobius's swapped stages (engine/pruning/swapped.py): the profile's
per-block nonzero counts, read from the tier a stage at a time."""

from __future__ import annotations

import torch

from jobctl.engine.mobius.masks import hold
from jobctl.engine.pruning.swapped import block_nonzero

from ..jobrun import tiny_spec
from .mobius_helpers import ADAMW, mobius_runner, one_thread  # noqa: F401 - one_thread: autouse


def _block(name: str) -> int:
    return int(name.split(".")[1])


def _whole_copies(runner) -> dict[int, int]:
    """The count as the profile took it before: every stage's weights at once."""
    out: dict[int, int] = {}
    for name, w in runner.weights().items():
        out[_block(name)] = out.get(_block(name), 0) + int(w.count_nonzero())
    return dict(sorted(out.items()))


def test_block_nonzero_of_a_pruned_runner_counts_as_its_whole_weights(tmp_path):
    spec = tiny_spec(**{"model.layers": 4, **ADAMW})
    runner = mobius_runner(spec, tmp_path, ((0, 1), (2,), (3, 4), (5,)))  # tie apart
    runner.step(0)
    gen = torch.Generator().manual_seed(0)
    shapes = {n: w.shape for n, w in runner.weights().items()}
    masks = {
        n: torch.rand(s, generator=gen) > 0.5 for n, s in shapes.items() if n.endswith("weight")
    }
    hold(runner, masks)
    runner.step(1)  # step 1's update still pending: both read the records as they are
    up = [runner.traffic.total(("params",))]
    got = block_nonzero(runner)
    up.append(runner.traffic.total(("params",)))
    assert got == _whole_copies(runner)
    up.append(runner.traffic.total(("params",)))
    assert up[1] - up[0] == up[2] - up[1]  # the same bytes read up
    assert set(got) == set(range(6))
    for b, n in got.items():  # no pruned weight counts
        pruned = sum(int((~m).sum()) for name, m in masks.items() if _block(name) == b)
        assert 0 < n <= sum(s.numel() for name, s in shapes.items() if _block(name) == b) - pruned
    runner.close()
