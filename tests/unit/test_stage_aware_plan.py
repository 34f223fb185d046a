"""Merak's stage-aware non-recompute ratios (sec. 5.2) and their tuning."""

from __future__ import annotations

import pytest

from jobctl.engine.planner.stage_aware import kept_blocks, ratios, tune


def test_ratios_follow_merak_formula():
    # s = 8, alpha_1 = 0.2: alpha_i = min(1, 7 * 0.2 / (8 - i)) for i in [2, 7), then
    # alpha_7 = alpha_6, alpha_8 = 1.
    a = ratios(8, 0.2)
    assert a[:6] == pytest.approx([0.2, 1.4 / 6, 1.4 / 5, 1.4 / 4, 1.4 / 3, 0.7])
    assert a[6] == a[5] and a[7] == 1.0
    assert ratios(2, 0.3) == [0.3, 1.0] and ratios(3, 0.3) == [0.3, 0.3, 1.0]
    assert ratios(1, 0.0) == [1.0]
    # Equal memory: (s - i) alpha_i is the same wherever alpha_i < 1.
    assert all((8 - i) * a[i - 1] == pytest.approx(7 * 0.2) for i in range(2, 7))


def test_tune_raises_alpha1_until_memory_is_full():
    stages = [[0, 1, 2, 3]] * 4
    inflight = [4, 3, 2, 1]

    def memory(keep):  # each kept block costs 1 per in-flight micro-batch
        return [10 + n * k for n, k in zip(inflight, keep, strict=True)]

    alpha1, alphas, keep = tune(stages, memory, cap=22)
    assert keep == kept_blocks(alphas, stages)
    assert max(memory(keep)) <= 22
    worse = kept_blocks(ratios(4, alpha1 + 0.05), stages)
    assert max(memory(worse)) > 22 or worse == keep
    assert tune(stages, memory, cap=5) is None
